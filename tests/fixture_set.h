/* fixture_set.h — shard sets made from the model fixtures (tests/fixtures/models/<model>/<src>)
 * with the built `pollen reshard`, for the tests that run the engine on a backend: the CPU engine,
 * the recording and streaming wrappers, and the CUDA backend. PLN_BUILD names the build directory
 * (default build). Include after tests/test.h. */
#ifndef PLN_FIXTURE_SET_H
#define PLN_FIXTURE_SET_H

#include "formats/common.h"
#include "runtime/engine.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline const char *fixture_build(void) {
    const char *b = getenv("PLN_BUILD");
    return b && *b ? b : "build";
}

/* True when this build has `pollen reshard` (tests SKIP otherwise). */
static inline bool fixture_can_reshard(void) {
    char *probe = pln_xasprintf("%s/pollen reshard --help >/dev/null 2>&1", fixture_build());
    int rc = system(probe);
    free(probe);
    return rc == 0;
}

/* Reshards fixture model/src to TP tp in dtype ("fp16", "int8") under the test's scratch
 * directory; returns the set's directory (caller frees), or NULL with the command on stderr. */
static inline char *fixture_reshard(const char *model, const char *src, int tp, const char *dtype) {
    char *out = pln_xasprintf("%s/%s-%s-tp%d-%s", test_tmpdir(), model, src, tp, dtype);
    char *cmd = pln_xasprintf("%s/pollen reshard tests/fixtures/models/%s/%s -o %s --tp %d --dtype %s --quiet",
                              fixture_build(), model, src, out, tp, dtype);
    int rc = system(cmd);
    if (rc) fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
    free(cmd);
    if (rc) { free(out); return NULL; }
    return out;
}

/* One sequence of a step plan: slot, n tokens, sample or not, default sampling parameters. */
static inline pln_step_seq fixture_seq(int32_t slot, const int32_t *tok, int32_t n, bool sample) {
    pln_step_seq s;
    memset(&s, 0, sizeof s);
    s.slot = slot;
    s.n_new = n;
    s.tokens = tok;
    s.sample = sample;
    pln_sample_params_default(&s.params);
    return s;
}

#endif
