/* test_httpreq.c — the request validation table: every parameter of /generate and
 * /v1/completions at its boundaries (0, negative, NaN, huge, wrong type), malformed JSON, a
 * non-object body, an empty prompt, an over-limit prompt and an oversized body, each mapped to the
 * documented status and a message naming the problem; plus the accepted forms and the UTF-8
 * helpers the streaming path relies on. */
#include "runtime/httpreq.h"
#include "formats/common.h"
#include "tests/test.h"

#include <jansson.h>
#include <unistd.h>

typedef struct {
    const char *body;
    int status;               /* 0 = accepted */
    const char *msg;          /* substring of the message */
} row;

static void run_table(const char *what, pln_api api, const row *rows, size_t n, const pln_serve_limits *lim) {
    for (size_t i = 0; i < n; i++) {
        pln_gen_request r;
        pln_req_error err;
        memset(&err, 0, sizeof err);
        int rc = api == PLN_API_TGI ? pln_req_parse_generate(rows[i].body, strlen(rows[i].body), lim, &r, &err)
                                    : pln_req_parse_completions(rows[i].body, strlen(rows[i].body), lim, &r, &err);
        if (rows[i].status == 0) {
            CHECK(rc == 0, "%s %s: rejected (%d %s)", what, rows[i].body, err.status, err.message);
            if (rc == 0) pln_gen_request_free(&r);
        } else {
            CHECK(rc == -1 && err.status == rows[i].status, "%s %s: want %d, got rc %d status %d (%s)", what, rows[i].body,
                  rows[i].status, rc, err.status, err.message);
            CHECK(rc == -1 && strstr(err.message, rows[i].msg), "%s %s: message '%s' lacks '%s'", what, rows[i].body,
                  err.message, rows[i].msg);
        }
    }
}

int main(void) {
    test_begin("test_httpreq");
    pln_serve_limits lim;
    pln_serve_limits_default(&lim);
    lim.max_total_tokens = 2048;

    static const row tgi[] = {
        {"{\"inputs\":\"hi\"}", 0, NULL},
        {"{\"inputs\":\"hi\",\"parameters\":null}", 0, NULL},
        {"{\"inputs\":\"hi\",\"parameters\":{\"max_new_tokens\":1,\"temperature\":0.5,\"top_k\":1,\"top_p\":1,"
         "\"repetition_penalty\":1.2,\"do_sample\":true,\"seed\":0,\"stop\":[\"a\"],\"details\":true}}", 0, NULL},
        {"{\"inputs\":\"hi\",\"parameters\":{\"max_new_tokens\":2048}}", 0, NULL},
        {"{\"inputs\":\"hi\",\"parameters\":{\"unknown_thing\":5}}", 0, NULL},
        /* body shape */
        {"", 422, "empty request body"},
        {"{", 422, "malformed JSON"},
        {"{\"inputs\":\"hi\",}", 422, "malformed JSON"},
        {"{\"inputs\": NaN}", 422, "malformed JSON"},
        {"[\"hi\"]", 422, "must be a JSON object"},
        {"\"hi\"", 422, "must be a JSON object"},
        {"42", 422, "must be a JSON object"},
        {"null", 422, "must be a JSON object"},
        {"{\"inputs\":\"a\",\"inputs\":\"b\"}", 422, "malformed JSON"},
        {"{}", 422, "missing field `inputs`"},
        {"{\"inputs\":\"\"}", 422, "`inputs` cannot be empty"},
        {"{\"inputs\":5}", 422, "`inputs` must be a string"},
        {"{\"inputs\":null}", 422, "`inputs` must be a string"},
        {"{\"inputs\":[\"a\"]}", 422, "`inputs` must be a string"},
        {"{\"inputs\":\"hi\",\"parameters\":[]}", 422, "`parameters` must be an object"},
        {"{\"inputs\":\"hi\",\"parameters\":\"x\"}", 422, "`parameters` must be an object"},
        /* max_new_tokens */
        {"{\"inputs\":\"hi\",\"parameters\":{\"max_new_tokens\":0}}", 422, "`max_new_tokens` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"max_new_tokens\":-1}}", 422, "`max_new_tokens` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"max_new_tokens\":2049}}", 422, "between 1 and 2048"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"max_new_tokens\":1e30}}", 422, "`max_new_tokens` must be an integer"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"max_new_tokens\":99999999999999999999999}}", 422, "malformed JSON"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"max_new_tokens\":1.5}}", 422, "`max_new_tokens` must be an integer"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"max_new_tokens\":\"10\"}}", 422, "`max_new_tokens` must be an integer"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"max_new_tokens\":\"NaN\"}}", 422, "`max_new_tokens` must be an integer"},
        /* temperature */
        {"{\"inputs\":\"hi\",\"parameters\":{\"temperature\":0}}", 422, "`temperature` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"temperature\":-0.5}}", 422, "`temperature` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"temperature\":1e300}}", 422, "`temperature` must be in (0, 100]"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"temperature\":1e999}}", 422, "malformed JSON"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"temperature\":\"hot\"}}", 422, "`temperature` must be a number"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"temperature\":\"NaN\"}}", 422, "`temperature` must be a number"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"temperature\":true}}", 422, "`temperature` must be a number"},
        /* top_k */
        {"{\"inputs\":\"hi\",\"parameters\":{\"top_k\":0}}", 422, "`top_k` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"top_k\":-3}}", 422, "`top_k` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"top_k\":10000000000}}", 422, "`top_k` must be between 1 and 2147483647"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"top_k\":2.5}}", 422, "`top_k` must be an integer"},
        /* top_p */
        {"{\"inputs\":\"hi\",\"parameters\":{\"top_p\":0}}", 422, "`top_p` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"top_p\":-1}}", 422, "`top_p` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"top_p\":1.0001}}", 422, "`top_p` must be in (0, 1]"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"top_p\":1e-300}}", 422, "`top_p` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"temperature\":1e-60}}", 422, "`temperature` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"top_p\":[0.5]}}", 422, "`top_p` must be a number"},
        /* repetition_penalty */
        {"{\"inputs\":\"hi\",\"parameters\":{\"repetition_penalty\":0}}", 422, "`repetition_penalty` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"repetition_penalty\":-2}}", 422, "`repetition_penalty` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"repetition_penalty\":1e9}}", 422, "`repetition_penalty` must be in (0, 100]"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"repetition_penalty\":{}}}", 422, "`repetition_penalty` must be a number"},
        /* do_sample, details */
        {"{\"inputs\":\"hi\",\"parameters\":{\"do_sample\":1}}", 422, "`do_sample` must be true or false"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"do_sample\":\"yes\"}}", 422, "`do_sample` must be true or false"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"details\":0}}", 422, "`details` must be true or false"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"return_full_text\":\"yes\"}}", 422, "`return_full_text` must be true or false"},
        /* seed */
        {"{\"inputs\":\"hi\",\"parameters\":{\"seed\":-1}}", 422, "`seed` must be between 0"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"seed\":1.5}}", 422, "`seed` must be an integer"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"seed\":\"1\"}}", 422, "`seed` must be an integer"},
        /* stop */
        {"{\"inputs\":\"hi\",\"parameters\":{\"stop\":\"x\"}}", 422, "`stop` must be an array of strings"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"stop\":[1]}}", 422, "`stop[0]` must be a string"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"stop\":[\"\"]}}", 422, "`stop[0]` cannot be empty"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}}", 422, "at most 4"},
        /* TGI's further parameters, with TGI's own messages */
        {"{\"inputs\":\"hi\",\"stream\":true,\"parameters\":{\"top_n_tokens\":5,\"typical_p\":0.5,\"truncate\":3,"
         "\"return_full_text\":true,\"watermark\":false,\"grammar\":null,\"adapter_id\":null}}", 0, NULL},
        {"{\"inputs\":\"hi\",\"parameters\":{\"best_of\":2,\"do_sample\":true,\"decoder_input_details\":true}}", 0, NULL},
        {"{\"inputs\":\"hi\",\"parameters\":{\"best_of\":2}}", 422, "you must use sampling when `best_of` is > 1"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"best_of\":2,\"do_sample\":true,\"seed\":1}}", 422, "`seed` must not be set"},
        {"{\"inputs\":\"hi\",\"stream\":true,\"parameters\":{\"best_of\":2,\"do_sample\":true}}", 422, "not supported when streaming"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"best_of\":5,\"do_sample\":true}}", 422, "`best_of` must be > 0 and <= 4"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"best_of\":0}}", 422, "`best_of` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"stream\":true,\"parameters\":{\"decoder_input_details\":true}}", 422, "not supported when streaming"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"top_n_tokens\":6}}", 422, "`top_n_tokens` must be >= 0 and <= 5"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"top_n_tokens\":-1}}", 422, "`top_n_tokens` must be between 0"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"typical_p\":0}}", 422, "`typical_p` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"typical_p\":1.5}}", 422, "`typical_p` must be in (0, 1]"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"truncate\":0}}", 422, "`truncate` must be strictly positive"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"truncate\":5000}}", 422, "`truncate` must be strictly positive and less than 1025"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"watermark\":true}}", 422, "`watermark` is not supported"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"grammar\":{\"type\":\"json\"}}}", 422, "`grammar` is not supported"},
        {"{\"inputs\":\"hi\",\"parameters\":{\"adapter_id\":\"a\"}}", 422, "`adapter_id` is not supported"},
        {"{\"inputs\":\"hi\",\"stream\":1}", 422, "`stream` must be true or false"},
    };
    run_table("tgi", PLN_API_TGI, tgi, sizeof tgi / sizeof tgi[0], &lim);

    static const row oai[] = {
        {"{\"prompt\":\"hi\"}", 0, NULL},
        {"{\"prompt\":[\"a\",\"b\"],\"max_tokens\":5,\"temperature\":0,\"top_p\":0.9,\"stop\":\"x\",\"stream\":true,"
         "\"seed\":3,\"model\":\"m\",\"n\":1,\"echo\":false,\"presence_penalty\":0}", 0, NULL},
        {"{\"prompt\":\"hi\",\"temperature\":2}", 0, NULL},
        {"{", 400, "malformed JSON"},
        {"[1]", 400, "must be a JSON object"},
        {"{}", 400, "missing field `prompt`"},
        {"{\"prompt\":\"\"}", 400, "`prompt` cannot be empty"},
        {"{\"prompt\":[]}", 400, "cannot be an empty list"},
        {"{\"prompt\":[\"a\",\"\"]}", 400, "`prompt[1]` cannot be empty"},
        {"{\"prompt\":[\"a\",3]}", 400, "`prompt[1]` must be a string"},
        {"{\"prompt\":7}", 400, "`prompt` must be a string, a list of strings, a list of token ids or a list of lists"},
        {"{\"prompt\":[1,2,3]}", 0, NULL},
        {"{\"prompt\":[[1,2],[3]]}", 0, NULL},
        {"{\"prompt\":[\"a\",[3]]}", 0, NULL},
        {"{\"prompt\":[[1],[]]}", 400, "`prompt[1]` cannot be empty"},
        {"{\"prompt\":[1,\"a\"]}", 400, "`prompt[1]` must be a token id"},
        {"{\"prompt\":[1,-2]}", 400, "`prompt[1]` must be a token id"},
        {"{\"prompt\":[1,2.0]}", 400, "`prompt[1]` must be a token id"},
        {"{\"prompt\":[[1,4294967296]]}", 400, "`prompt[0][1]` must be a token id"},
        {"{\"prompt\":[true]}", 400, "`prompt[0]` must be a string or a list of token ids"},
        {"{\"prompt\":\"hi\",\"max_tokens\":0}", 400, "`max_tokens` must be strictly positive"},
        {"{\"prompt\":\"hi\",\"max_tokens\":-5}", 400, "`max_tokens` must be strictly positive"},
        {"{\"prompt\":\"hi\",\"max_tokens\":100000000}", 400, "between 1 and 2048"},
        {"{\"prompt\":\"hi\",\"max_tokens\":\"5\"}", 400, "`max_tokens` must be an integer"},
        {"{\"prompt\":\"hi\",\"temperature\":-1}", 400, "`temperature` must be in [0, 2]"},
        {"{\"prompt\":\"hi\",\"temperature\":2.5}", 400, "`temperature` must be in [0, 2]"},
        {"{\"prompt\":\"hi\",\"temperature\":\"NaN\"}", 400, "`temperature` must be a number"},
        {"{\"prompt\":\"hi\",\"top_p\":0}", 400, "`top_p` must be strictly positive"},
        {"{\"prompt\":\"hi\",\"top_p\":2}", 400, "`top_p` must be in (0, 1]"},
        {"{\"prompt\":\"hi\",\"stop\":5}", 400, "`stop` must be a string or an array"},
        {"{\"prompt\":\"hi\",\"stream\":\"yes\"}", 400, "`stream` must be true or false"},
        {"{\"prompt\":\"hi\",\"n\":2,\"best_of\":3,\"logprobs\":5,\"echo\":true,\"presence_penalty\":-2,"
         "\"frequency_penalty\":2,\"suffix\":\"\",\"logit_bias\":{},\"user\":\"u\",\"typical_p\":0.9}", 0, NULL},
        {"{\"prompt\":\"hi\",\"n\":0}", 400, "`n` must be strictly positive"},
        {"{\"prompt\":\"hi\",\"n\":5}", 400, "`n` must be between 1 and 4"},
        {"{\"prompt\":\"hi\",\"n\":3,\"best_of\":2}", 400, "greater than or equal to `n`"},
        {"{\"prompt\":\"hi\",\"n\":1,\"best_of\":2,\"stream\":true}", 400, "cannot be streamed"},
        {"{\"prompt\":\"hi\",\"logprobs\":6}", 400, "`logprobs` must be between 0 and 5"},
        {"{\"prompt\":\"hi\",\"logprobs\":true}", 400, "`logprobs` must be an integer"},
        {"{\"prompt\":\"hi\",\"suffix\":\"x\"}", 400, "`suffix` is not supported"},
        {"{\"prompt\":\"hi\",\"logit_bias\":{\"5\":1}}", 400, "`logit_bias` is not supported"},
        {"{\"prompt\":\"hi\",\"frobnicate\":1}", 400, "Unrecognized request argument supplied: frobnicate"},
        {"{\"prompt\":\"hi\",\"presence_penalty\":2.5}", 400, "`presence_penalty` must be in [-2, 2]"},
        {"{\"prompt\":\"hi\",\"stream_options\":true}", 400, "`stream_options` must be an object"},
        {"{\"prompt\":\"hi\",\"stream_options\":{\"include_usage\":1}}", 400, "`include_usage` must be true or false"},
        {"{\"prompt\":\"hi\",\"model\":5}", 400, "`model` must be a string"},
        {"{\"prompt\":\"hi\",\"seed\":-4}", 400, "`seed` must be between 0"},
    };
    run_table("openai", PLN_API_OPENAI, oai, sizeof oai / sizeof oai[0], &lim);

    /* parsed values */
    pln_gen_request r;
    pln_req_error err;
    {
        const char *o = "{\"prompt\":[\"a\",\"b\"],\"n\":2,\"best_of\":3,\"logprobs\":2,\"echo\":true,\"presence_penalty\":0.5,"
                        "\"frequency_penalty\":-1}";
        CHECK(pln_req_parse_completions(o, strlen(o), &lim, &r, &err) == 0, "parse: %s", err.message);
        CHECK(r.n == 2 && r.best_of == 3 && r.top_n == 2 && r.logprobs && r.echo && r.prompt_logprobs,
              "n/best_of/logprobs/echo parsed (%d %d %d)", r.n, r.best_of, r.top_n);
        CHECK(r.sample.presence_penalty == 0.5f && r.sample.frequency_penalty == -1.0f, "penalties parsed");
        pln_gen_request_free(&r);
        const char *t = "{\"inputs\":\"a\",\"parameters\":{\"typical_p\":0.5,\"best_of\":2,\"top_n_tokens\":3,"
                        "\"decoder_input_details\":true,\"truncate\":7}}";
        CHECK(pln_req_parse_generate(t, strlen(t), &lim, &r, &err) == 0, "parse: %s", err.message);
        CHECK(r.sample.typical_p == 0.5f && r.sample.do_sample && r.best_of == 2 && r.n == 1 && r.top_n == 3 &&
              r.prompt_logprobs && r.truncate == 7 && !r.stream, "TGI extras parsed; typical_p turns sampling on");
        pln_gen_request_free(&r);
    }
    const char *b = "{\"inputs\":\"hello\",\"parameters\":{\"max_new_tokens\":7,\"top_k\":5,\"seed\":42,\"stop\":[\"x\",\"yz\"],\"details\":true}}";
    CHECK(pln_req_parse_generate(b, strlen(b), &lim, &r, &err) == 0, "parse: %s", err.message);
    CHECK(r.n_prompts == 1 && !strcmp(r.prompts[0], "hello"), "inputs");
    CHECK(r.max_new_tokens == 7 && r.sample.top_k == 5 && r.sample.do_sample, "top_k implies sampling (TGI)");
    CHECK(r.seed_set && r.sample.seed == 42 && r.n_stop == 2 && !strcmp(r.stop[1], "yz") && r.details, "seed/stop/details");
    pln_gen_request_free(&r);
    b = "{\"inputs\":\"hello\"}";
    CHECK(pln_req_parse_generate(b, strlen(b), &lim, &r, &err) == 0 && !r.sample.do_sample &&
              r.max_new_tokens == lim.default_max_new_tokens && !r.seed_set, "TGI defaults: greedy, default max_new_tokens");
    pln_gen_request_free(&r);
    b = "{\"prompt\":[\"a\",\"b\",\"c\"],\"temperature\":0,\"stop\":\"\\n\"}";
    CHECK(pln_req_parse_completions(b, strlen(b), &lim, &r, &err) == 0 && r.n_prompts == 3 && !r.sample.do_sample &&
              r.max_new_tokens == 16 && r.n_stop == 1 && !strcmp(r.stop[0], "\n"), "OpenAI list prompt, greedy, stop string");
    pln_gen_request_free(&r);
    b = "{\"prompt\":\"a\"}";
    CHECK(pln_req_parse_completions(b, strlen(b), &lim, &r, &err) == 0 && r.sample.do_sample && r.sample.temperature == 1.0f,
          "OpenAI default temperature 1 samples");
    pln_gen_request_free(&r);
    /* text prompts get the tokenizer's post-processor (TGI, vLLM's completions default);
     * add_special_tokens turns it off on /v1/completions, and must be a bool */
    b = "{\"inputs\":\"hello\"}";
    CHECK(pln_req_parse_generate(b, strlen(b), &lim, &r, &err) == 0 && r.add_special, "TGI: add_special");
    pln_gen_request_free(&r);
    b = "{\"prompt\":\"a\"}";
    CHECK(pln_req_parse_completions(b, strlen(b), &lim, &r, &err) == 0 && r.add_special,
          "completions: add_special_tokens defaults to true");
    pln_gen_request_free(&r);
    b = "{\"prompt\":\"a\",\"add_special_tokens\":false}";
    CHECK(pln_req_parse_completions(b, strlen(b), &lim, &r, &err) == 0 && !r.add_special, "completions: add_special_tokens false");
    pln_gen_request_free(&r);
    b = "{\"prompt\":\"a\",\"add_special_tokens\":\"no\"}";
    CHECK(pln_req_parse_completions(b, strlen(b), &lim, &r, &err) == -1 && err.status == 400 &&
              strstr(err.message, "`add_special_tokens` must be true or false"), "add_special_tokens not a bool: %s", err.message);

    /* oversized body: 413 before parsing; exactly at the limit is parsed */
    pln_serve_limits small = lim;
    small.max_body_bytes = 32;
    b = "{\"inputs\":\"0123456789012345678901234567\"}";
    CHECK(pln_req_parse_generate(b, strlen(b), &small, &r, &err) == -1 && err.status == 413 &&
              strstr(err.message, "--max-body-bytes"), "oversized body -> 413 (%d %s)", err.status, err.message);
    b = "{\"inputs\":\"0123456789012345678\"}";   /* 32 bytes */
    CHECK(strlen(b) == 32 && pln_req_parse_generate(b, strlen(b), &small, &r, &err) == 0, "body at the limit accepted");
    pln_gen_request_free(&r);
    char *tok_text = NULL;
    b = "{\"inputs\":\"abc\"}";
    CHECK(pln_req_parse_tokenize(b, strlen(b), &lim, &tok_text, &err) == 0 && !strcmp(tok_text, "abc"), "tokenize body");
    free(tok_text);
    b = "{\"inputs\":\"\"}";
    CHECK(pln_req_parse_tokenize(b, strlen(b), &lim, &tok_text, &err) == -1 && err.status == 422, "tokenize empty");
    /* token-id prompts: kept as ids, their form remembered for error messages */
    b = "{\"prompt\":[[5,6],\"hi\",[7]]}";
    CHECK(pln_req_parse_completions(b, strlen(b), &lim, &r, &err) == 0 && r.n_prompts == 3 && r.prompt_ids &&
              r.n_prompt_ids[0] == 2 && r.prompt_ids[0][1] == 6 && !r.prompt_ids[1] && !strcmp(r.prompts[1], "hi") &&
              !r.prompts[0] && r.prompt_ids[2][0] == 7 && !r.prompt_ids_flat, "nested ids and text");
    pln_gen_request_free(&r);
    b = "{\"prompt\":[0,2147483647]}";
    CHECK(pln_req_parse_completions(b, strlen(b), &lim, &r, &err) == 0 && r.n_prompts == 1 && r.prompt_ids_flat &&
              r.n_prompt_ids[0] == 2 && r.prompt_ids[0][1] == 2147483647, "flat ids");
    pln_gen_request_free(&r);
    /* /tokenize: the form is found from the body */
    pln_tokenize_request tr;
    b = "{\"prompt\":\"ab\",\"add_special_tokens\":false}";
    CHECK(pln_req_parse_tokenize_any(b, strlen(b), &lim, &tr, &err) == 0 && tr.vllm && !tr.add_special && !strcmp(tr.text, "ab"),
          "vLLM tokenize body");
    pln_tokenize_request_free(&tr);
    b = "{\"inputs\":\"ab\"}";
    CHECK(pln_req_parse_tokenize_any(b, strlen(b), &lim, &tr, &err) == 0 && !tr.vllm && tr.add_special && !strcmp(tr.text, "ab"),
          "TGI tokenize body");
    pln_tokenize_request_free(&tr);
    b = "{\"prompt\":\"ab\",\"add_special_tokens\":1}";
    CHECK(pln_req_parse_tokenize_any(b, strlen(b), &lim, &tr, &err) == -1 && tr.vllm && err.status == 400 && !tr.text,
          "vLLM tokenize: a bad field is a 400 (%s)", err.message);
    b = "{oops";
    CHECK(pln_req_parse_tokenize_any(b, strlen(b), &lim, &tr, &err) == -1 && !tr.vllm && err.status == 422, "not JSON: TGI's 422");
    /* vLLM /detokenize bodies */
    int32_t *dids = NULL, dn = -1;
    char *dmodel = NULL;
    b = "{\"tokens\":[3,4,5],\"model\":\"m\"}";
    CHECK(pln_req_parse_detokenize(b, strlen(b), &lim, &dids, &dn, &dmodel, &err) == 0 && dn == 3 && dids[2] == 5 && dmodel &&
              !strcmp(dmodel, "m"), "detokenize body");
    free(dids);
    free(dmodel);
    b = "{\"tokens\":[]}";
    CHECK(pln_req_parse_detokenize(b, strlen(b), &lim, &dids, &dn, &dmodel, &err) == 0 && dn == 0 && dids && !dmodel, "detokenize []");
    free(dids);
    static const char *const dbad[][2] = {{"{\"tokens\":[1,-1]}", "`tokens[1]`"}, {"{\"tokens\":\"x\"}", "`tokens` must be a list"},
                                          {"{\"model\":\"m\"}", "`tokens` must be a list"}, {"{\"tokens\":[1],\"model\":3}", "`model`"},
                                          {"{\"tokens\":[1],\"x\":1}", "Unrecognized request argument supplied: x"},
                                          {"[1]", "must be a JSON object"}};
    for (size_t i = 0; i < sizeof dbad / sizeof dbad[0]; i++)
        CHECK(pln_req_parse_detokenize(dbad[i][0], strlen(dbad[i][0]), &lim, &dids, &dn, &dmodel, &err) == -1 && err.status == 400 &&
                  strstr(err.message, dbad[i][1]) && !dids && !dmodel, "detokenize %s -> 400 %s (%s)", dbad[i][0], dbad[i][1], err.message);

    /* token-count limits */
    lim.max_input_tokens = 10;
    lim.max_total_tokens = 20;
    CHECK(pln_req_check_lengths(PLN_API_TGI, NULL, NULL, 10, 10, &lim, &err) == 0, "at both limits ok");
    CHECK(pln_req_check_lengths(PLN_API_TGI, NULL, NULL, 0, 10, &lim, &err) == -1 && err.status == 422 && strstr(err.message, "cannot be empty"),
          "0 tokens");
    CHECK(pln_req_check_lengths(PLN_API_TGI, NULL, NULL, 11, 1, &lim, &err) == -1 && err.status == 422 && strstr(err.message, "--max-input-tokens"),
          "over max_input_tokens: %s", err.message);
    CHECK(pln_req_check_lengths(PLN_API_OPENAI, NULL, NULL, 10, 11, &lim, &err) == -1 && err.status == 400 &&
              !strcmp(err.param, "max_tokens") && strstr(err.message, "--max-total-tokens"), "over max_total_tokens: %s", err.message);
    CHECK(pln_req_check_lengths(PLN_API_OPENAI, NULL, NULL, 10, 11, &lim, &err) == -1 && !strstr(err.message, "inputs") &&
              strstr(err.message, "`prompt` tokens + `max_tokens`"), "OpenAI words, not TGI's: %s", err.message);

    /* error bodies */
    pln_req_fail(&err, PLN_API_TGI, 429, NULL, "busy");
    char *js = pln_req_error_json(PLN_API_TGI, &err);
    CHECK(!strcmp(js, "{\"error\":\"busy\",\"error_type\":\"overloaded\"}"), "TGI error body %s", js);
    free(js);
    pln_req_fail(&err, PLN_API_OPENAI, 400, "top_p", "bad \xff value");
    js = pln_req_error_json(PLN_API_OPENAI, &err);
    json_t *o = json_loads(js, 0, NULL);
    json_t *e = json_object_get(o, "error");
    CHECK(e && !strcmp(json_string_value(json_object_get(e, "type")), "invalid_request_error") &&
              !strcmp(json_string_value(json_object_get(e, "param")), "top_p") && json_is_null(json_object_get(e, "code")) &&
              strstr(json_string_value(json_object_get(e, "message")), "\xEF\xBF\xBD"), "OpenAI error body %s", js);
    json_decref(o);
    free(js);

    /* UTF-8 helpers: "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80 */
    CHECK(pln_utf8_complete_len("ab\xC3", 3) == 2, "incomplete 2-byte held back");
    CHECK(pln_utf8_complete_len("a\xE2\x82", 3) == 1, "incomplete 3-byte held back");
    CHECK(pln_utf8_complete_len("a\xF0\x9F\x98\x80", 5) == 5, "complete 4-byte");
    CHECK(pln_utf8_complete_len("a\xFF", 2) == 2, "invalid byte counts as complete");
    CHECK(pln_utf8_complete_len("\xC3" "a", 2) == 2, "broken sequence counts as complete");
    size_t ol;
    char *sz = pln_utf8_sanitize("a\xC3\xA9\xFF" "b\xE2\x82", 7, &ol);
    CHECK(!strcmp(sz, "a\xC3\xA9\xEF\xBF\xBD" "b\xEF\xBF\xBD") && ol == strlen(sz), "sanitize %s", sz);
    free(sz);
    sz = pln_utf8_sanitize("\xE2\x80\xE2\x80" "A\xF0\x9F\x41", 8, &ol);   /* maximal subparts: one U+FFFD each */
    CHECK(!strcmp(sz, "\xEF\xBF\xBD\xEF\xBF\xBD" "A\xEF\xBF\xBD" "A"), "maximal subparts %s", sz);
    free(sz);
    /* piecewise sanitizing at complete_len boundaries equals sanitizing the whole */
    const char *full = "x\xE2\x82\xAC\xC3" "A\xF0\x9F\x98\x80";
    size_t fl = strlen(full), emitted = 0;
    char acc[128] = "";
    for (size_t cut = 1; cut <= fl; cut++) {
        size_t safe = cut == fl ? fl : pln_utf8_complete_len(full, cut);
        if (safe < emitted) safe = emitted;
        char *p = pln_utf8_sanitize(full + emitted, safe - emitted, NULL);
        strcat(acc, p);
        free(p);
        emitted = safe;
    }
    sz = pln_utf8_sanitize(full, fl, NULL);
    CHECK(!strcmp(acc, sz), "streamed pieces equal the whole");
    free(sz);
    /* chat: template loading (bad files name the field) and rendering into a completions request */
    {
        char dir[] = "/tmp/pln-test-chat-XXXXXX", path[64];
        CHECK(mkdtemp(dir) != NULL, "tmp dir");
        snprintf(path, sizeof path, "%s/t.json", dir);
        static const struct { const char *text, *msg; } bad_tpl[] = {
            {"[1]", "is a JSON object"},
            {"{\"user\":{\"prefx\":\"\"}}", "unknown key `user.prefx`"},
            {"{\"robot\":{}}", "unknown key `robot`"},
            {"{\"user\":{\"prefix\":3}}", "`user.prefix` must be a string"},
            {"{\"stop\":[\"\"]}", "`stop[0]` must be a string of 1 to 256 bytes"},
            {"{\"user\": ", "not a chat template"},
        };
        pln_chat_template t;
        for (size_t i = 0; i < sizeof bad_tpl / sizeof bad_tpl[0]; i++) {
            FILE *f = fopen(path, "w");
            fputs(bad_tpl[i].text, f);
            fclose(f);
            int rc = pln_chat_template_load(path, &t);
            CHECK(rc == -1 && strstr(pln_error(), bad_tpl[i].msg) && strstr(pln_error(), path), "template %s: '%s' lacks '%s'",
                  bad_tpl[i].text, pln_error(), bad_tpl[i].msg);
        }
        FILE *f = fopen(path, "w");
        fputs("{\"system\":{\"suffix\":\"\\n\"},\"user\":{\"prefix\":\"U: \",\"suffix\":\"\\n\"},"
              "\"assistant\":{\"prefix\":\"A: \",\"suffix\":\"\\n\"},\"generation_prompt\":\"A:\",\"stop\":[\"\\nU:\"]}", f);
        fclose(f);
        CHECK(pln_chat_template_load(path, &t) == 0, "template loads: %s", pln_error());
        const char *cb = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\","
                         "\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]},{\"role\":\"assistant\",\"content\":\"yo\"},"
                         "{\"role\":\"user\",\"content\":\"more\"}],\"max_completion_tokens\":7,\"logprobs\":true,"
                         "\"top_logprobs\":3,\"stop\":\"X\"}";
        CHECK(pln_req_parse_chat(cb, strlen(cb), &lim, &t, &r, &err) == 0, "chat parses: %s", err.message);
        CHECK(r.chat && r.n_prompts == 1 && !strcmp(r.prompts[0], "S\nU: hi\nA: yo\nU: more\nA:"), "rendered prompt '%s'",
              r.n_prompts ? r.prompts[0] : "");
        CHECK(r.max_new_tokens == 7 && r.logprobs && r.top_n == 3, "max_completion_tokens, logprobs + top_logprobs");
        CHECK(r.n_stop == 2 && !strcmp(r.stop[0], "X") && !strcmp(r.stop[1], "\nU:"), "request stop + the template's");
        /* a rendered template writes its own specials (bos_token): encoded without the
         * post-processor, unless add_special_tokens asks (vLLM's chat default is false) */
        CHECK(!r.add_special, "chat: add_special_tokens defaults to false");
        pln_gen_request_free(&r);
        const char *cs = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"add_special_tokens\":true}";
        CHECK(pln_req_parse_chat(cs, strlen(cs), &lim, &t, &r, &err) == 0 && r.add_special, "chat: add_special_tokens true");
        pln_gen_request_free(&r);
        cs = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"add_special_tokens\":null}";
        CHECK(pln_req_parse_chat(cs, strlen(cs), &lim, &t, &r, &err) == 0 && !r.add_special, "chat: add_special_tokens null");
        pln_gen_request_free(&r);
        static const row chat_bad[] = {
            {"{\"messages\":[]}", 400, "`messages` must be a non-empty list"},
            {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 400, "must be system, user or assistant"},
            {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "must be a string or a list of text parts"},
            {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400, "only {\"type\": \"text\""},
            {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[]}", 400, "Unrecognized request argument supplied: tools"},
            {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400, "needs `logprobs` true"},
            {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":3}", 400, "`temperature` must be in [0, 2]"},
        };
        for (size_t i = 0; i < sizeof chat_bad / sizeof chat_bad[0]; i++) {
            int rc = pln_req_parse_chat(chat_bad[i].body, strlen(chat_bad[i].body), &lim, &t, &r, &err);
            CHECK(rc == -1 && err.status == 400 && strstr(err.message, chat_bad[i].msg), "chat %s: %d '%s'", chat_bad[i].body,
                  err.status, err.message);
            if (!rc) pln_gen_request_free(&r);
        }
        /* the client's four stop sequences are allowed beside the template's; a fifth is not */
        const char *four = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",\"b\",\"c\",\"d\"]}";
        CHECK(pln_req_parse_chat(four, strlen(four), &lim, &t, &r, &err) == 0 && r.n_stop == 5 && !strcmp(r.stop[4], "\nU:"),
              "four client stop sequences + the template's one: accepted, five in all (%s)", err.message);
        if (r.prompts) pln_gen_request_free(&r);
        /* errors name the field the chat client sent, never the completions field it became */
        static const struct { const char *body, *param, *msg, *not_in; } named[] = {
            {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop",
             "`stop` has 5 sequences; at most 4", "has 6"},
            {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}", "max_completion_tokens",
             "`max_completion_tokens`", "`max_tokens`"},
            {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":\"7\"}", "max_completion_tokens",
             "`max_completion_tokens`", "`max_tokens`"},
            {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", "max_tokens", "`max_tokens`",
             "max_completion_tokens"},
            {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":99}", "top_logprobs",
             "`top_logprobs`", "`logprobs`"},
            {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", "logprobs", "`logprobs` must be true or false",
             "top_logprobs"},
        };
        for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
            int rc = pln_req_parse_chat(named[i].body, strlen(named[i].body), &lim, &t, &r, &err);
            CHECK(rc == -1 && err.status == 400 && !strcmp(err.param, named[i].param) && strstr(err.message, named[i].msg) &&
                      !strstr(err.message, named[i].not_in),
                  "chat %s: param '%s' (want %s), '%s' names %s", named[i].body, err.param, named[i].param, err.message, named[i].msg);
            if (!rc) pln_gen_request_free(&r);
        }
        /* after tokenizing: the names the request carries */
        const char *mct = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":5}";
        CHECK(pln_req_parse_chat(mct, strlen(mct), &lim, &t, &r, &err) == 0 && !strcmp(r.prompt_field, "messages") &&
                  !strcmp(r.max_tokens_field, "max_completion_tokens"), "chat request carries its field names");
        pln_serve_limits l3 = lim;
        l3.max_total_tokens = 8;
        l3.max_input_tokens = 6;
        CHECK(pln_req_check_lengths(r.api, r.prompt_field, r.max_tokens_field, 6, 5, &l3, &err) == -1 &&
                  !strcmp(err.param, "max_completion_tokens") && strstr(err.message, "`messages` tokens + `max_completion_tokens`") &&
                  !strstr(err.message, "`max_tokens`") && !strstr(err.message, "inputs"),
              "total tokens: %s", err.message);
        CHECK(pln_req_check_lengths(r.api, r.prompt_field, r.max_tokens_field, 7, 1, &l3, &err) == -1 &&
                  !strcmp(err.param, "messages") && strstr(err.message, "`messages` must have less than 7 tokens"),
              "input tokens: %s", err.message);
        pln_gen_request_free(&r);
        pln_chat_template_free(&t);
        unlink(path);
        rmdir(dir);
    }
    return test_done();
}
