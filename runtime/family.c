/* family.c — the runtime's registry of model families (runtime/family.h), by layout id. */
#include "runtime/family.h"

#include <string.h>

static const pln_model_family *const FAMILIES[] = {&pln_model_family_bloom, &pln_model_family_llama};
#define N_FAMILIES (sizeof FAMILIES / sizeof FAMILIES[0])

const pln_model_family *pln_model_family_by_layout(const char *layout) {
    char known[256];
    size_t n = 0;
    for (size_t f = 0; f < N_FAMILIES; f++) {
        if (layout && !strcmp(FAMILIES[f]->layout, layout)) return FAMILIES[f];
        n += (size_t)snprintf(known + n, sizeof known - n, "%s\"%s\"", n ? ", " : "", FAMILIES[f]->layout);
    }
    pln_errorf("layout \"%s\" is not supported (this runtime runs %s)", layout ? layout : "(none)", known);
    return NULL;
}
