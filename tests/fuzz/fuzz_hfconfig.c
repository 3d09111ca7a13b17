/* fuzz_hfconfig.c — libFuzzer target: any bytes as a config.json (jansson parse, then the BLOOM
 * config checks); accepted configs must satisfy the invariants the loader promises. */
#include "formats/hf.h"

#include <jansson.h>
#include <stdint.h>
#include <stddef.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t err;
    json_t *o = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &err);
    if (!o) return 0;
    pln_bloom_config c;
    if (pln_bloom_config_from_json(o, "fuzz", &c) == 0) {
        if (c.hidden_size <= 0 || c.n_head <= 0 || c.n_layer <= 0 || c.vocab_size <= 0 || c.hidden_size % c.n_head)
            __builtin_trap();
    }
    json_decref(o);
    return 0;
}
