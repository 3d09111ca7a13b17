/* fuzz_jinja.c — libFuzzer target: any bytes as a chat template, parsed and rendered against a
 * fixed conversation (with tools and special tokens) under small sandbox bounds. A parse must
 * succeed or fail with "NAME:LINE: ..."; a render must end in one of the four statuses, with
 * output only on success and within the output bound; nothing may crash, hang or leak. */
#include "runtime/jinja.h"
#include "formats/common.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static json_t *fuzz_jinja_vars(void) {
    static json_t *vars;
    if (!vars)
        vars = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                          " {\"role\": \"user\", \"content\": \"H\\u00e9llo \\ud83c\\udf38\"},"
                          " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"type\": \"function\","
                          "  \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, true]}}}]},"
                          " {\"role\": \"tool\", \"content\": \"{}\"}],"
                          " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
                          " \"documents\": null, \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}",
                          0, NULL);
    return vars;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    pln_jinja *t = pln_jinja_parse((const char *)data, size, "fuzz.jinja");
    if (!t) {
        if (strncmp(pln_error(), "fuzz.jinja:", 11)) __builtin_trap();
        return 0;
    }
    pln_jinja_limits lim;
    pln_jinja_limits_default(&lim);
    lim.max_steps = 20000;
    lim.max_output = 1 << 16;
    lim.max_memory = 16 << 20;
    lim.max_depth = 16;
    lim.now = 0;
    char *out = NULL;
    size_t n = 0;
    pln_jinja_status st = pln_jinja_render(t, fuzz_jinja_vars(), &lim, &out, &n);
    if (st == PLN_JINJA_OK) {
        if (!out || n > lim.max_output || out[n] != 0) __builtin_trap();
    } else {
        if (out || (st != PLN_JINJA_RAISED && st != PLN_JINJA_ERROR && st != PLN_JINJA_LIMIT)) __builtin_trap();
        if (st != PLN_JINJA_RAISED && strncmp(pln_error(), "fuzz.jinja:", 11)) __builtin_trap();
    }
    free(out);
    pln_jinja_free(t);
    return 0;
}
