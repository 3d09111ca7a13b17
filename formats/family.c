/* family.c — the registry of model families (family.h): model_type and layout id to family. */
#include "formats/family.h"

#include <string.h>

static const pln_family *const FAMILIES[] = {&pln_family_bloom, &pln_family_llama};
#define N_FAMILIES (sizeof FAMILIES / sizeof FAMILIES[0])

const char *pln_family_model_types(void) {
    static char buf[256];
    if (!buf[0]) {
        size_t n = 0;
        for (size_t f = 0; f < N_FAMILIES; f++)
            for (const char *const *t = FAMILIES[f]->model_types; *t; t++)
                n += (size_t)snprintf(buf + n, sizeof buf - n, "%s\"%s\"", n ? ", " : "", *t);
    }
    return buf;
}

const char *pln_family_layouts(void) {
    static char buf[256];
    if (!buf[0]) {
        size_t n = 0;
        for (size_t f = 0; f < N_FAMILIES; f++)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%s\"%s\"", n ? ", " : "", FAMILIES[f]->layout);
    }
    return buf;
}

const pln_family *pln_family_by_model_type(const char *model_type) {
    if (!model_type || !*model_type) model_type = "bloom";
    for (size_t f = 0; f < N_FAMILIES; f++)
        for (const char *const *t = FAMILIES[f]->model_types; *t; t++)
            if (!strcmp(*t, model_type)) return FAMILIES[f];
    pln_errorf("model_type \"%s\" is not supported (this pollen reads %s)", model_type, pln_family_model_types());
    return NULL;
}

const pln_family *pln_family_by_layout(const char *layout) {
    for (size_t f = 0; f < N_FAMILIES; f++)
        if (layout && !strcmp(FAMILIES[f]->layout, layout)) return FAMILIES[f];
    pln_errorf("layout \"%s\" is not known to this pollen (it knows %s)", layout ? layout : "(none)", pln_family_layouts());
    return NULL;
}

const pln_family *pln_family_of(const pln_hf_config *c) {
    const pln_family *f = pln_family_by_model_type(c->model_type);
    PLN_ASSERT(f);   /* a config only parses with a known model_type */
    return f;
}
