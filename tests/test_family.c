/* test_family.c — the model-family seam (formats/family.h, runtime/family.h): config.json's
 * model_type and a set's layout id lead to one family on both sides, and anything else is refused
 * with an error naming the field and what this pollen reads. */
#include "formats/family.h"
#include "runtime/family.h"
#include "tests/test.h"

static char *write_cfg(const char *name, const char *text) {
    char *p = pln_xasprintf("%s/%s", test_tmpdir(), name);
    FILE *f = fopen(p, "w");
    if (!f) { perror(p); exit(2); }
    fputs(text, f);
    fclose(f);
    return p;
}

static void test_registry(void) {
    const pln_family *b = pln_family_by_model_type("bloom");
    CHECK(b == &pln_family_bloom, "model_type bloom -> the BLOOM family");
    CHECK(pln_family_by_model_type("") == b && pln_family_by_model_type(NULL) == b, "no model_type is BLOOM (older configs)");
    CHECK(pln_family_by_layout("bloom-tp-v1") == b, "layout bloom-tp-v1 -> BLOOM");
    CHECK(!strcmp(b->layout, PLN_LAYOUT_BLOOM_TP_V1), "BLOOM's layout id is unchanged");
    CHECK(pln_family_by_model_type("gpt2") == NULL && strstr(pln_error(), "\"gpt2\"") && strstr(pln_error(), "\"bloom\""),
          "unknown model_type refused, naming it and the known ones: %s", pln_error());
    CHECK(pln_family_by_layout("gpt2-tp-v1") == NULL && strstr(pln_error(), "gpt2-tp-v1") && strstr(pln_error(), "bloom-tp-v1"),
          "unknown layout refused: %s", pln_error());
    CHECK(pln_model_family_by_layout("bloom-tp-v1") == &pln_model_family_bloom, "the runtime runs bloom-tp-v1");
    CHECK(pln_model_family_by_layout("nope") == NULL && strstr(pln_error(), "\"nope\"") && strstr(pln_error(), "bloom-tp-v1"),
          "the runtime refuses an unknown layout: %s", pln_error());
    /* every formats-side family has a runtime side under the same layout id */
    CHECK(pln_model_family_by_layout(pln_family_bloom.layout) != NULL, "BLOOM runs");
}

static void test_config_dispatch(void) {
    pln_hf_config c;
    char *p = write_cfg("bloom.json", "{\"model_type\":\"bloom\",\"vocab_size\":10,\"hidden_size\":8,\"n_head\":2,\"n_layer\":1}");
    CHECK(pln_hf_config_load(p, &c) == 0 && !strcmp(c.model_type, "bloom") && pln_family_of(&c) == &pln_family_bloom,
          "bloom config: %s", pln_error());
    CHECK(c.n_eos == 1 && c.eos_ids[0] == 2, "BLOOM's eos as a one-element list");
    free(p);
    p = write_cfg("t5.json", "{\"model_type\":\"t5\",\"vocab_size\":10,\"hidden_size\":8,\"n_head\":2,\"n_layer\":1}");
    CHECK(pln_hf_config_load(p, &c) == -1 && strstr(pln_error(), p) && strstr(pln_error(), "\"model_type\"") &&
          strstr(pln_error(), "\"t5\""), "unknown model_type names the file and the key: %s", pln_error());
    free(p);
    p = write_cfg("num.json", "{\"model_type\":7,\"vocab_size\":10}");
    CHECK(pln_hf_config_load(p, &c) == -1 && strstr(pln_error(), "\"model_type\""), "model_type not a string: %s", pln_error());
    free(p);
}

int main(void) {
    test_begin("test_family");
    test_registry();
    test_config_dispatch();
    return test_done();
}
