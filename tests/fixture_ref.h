/* fixture_ref.h — reads a model fixture's reference outputs (tests/fixtures/models/<m>/reference-*.
 * safetensors, written by transformers: see tests/fixtures/README.md) into plain pointers, for the
 * engine tests on every backend. */
#ifndef PLN_FIXTURE_REF_H
#define PLN_FIXTURE_REF_H

#include "formats/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPROMPT 4

typedef struct {
    pln_safetensors st;
    int32_t n[NPROMPT];            /* prompt lengths */
    const int32_t *ids[NPROMPT];   /* prompt ids */
    const float *logits[NPROMPT];  /* [n, vocab] at every position */
    const int32_t *gids[NPROMPT];  /* prompt + greedy ids */
    int32_t gn[NPROMPT];
    const float *glp[NPROMPT];     /* greedy log-probs */
    const int32_t *bids, *bmask;   /* left-padded batch [B, L] */
    const float *blogits;          /* [B, L, vocab] */
    int64_t B, L;
} ref_t;

/* A missing tensor means the fixture and its reader disagree: stop the test binary. */
static inline const pln_tensor *ref_need(const pln_safetensors *st, const char *name) {
    const pln_tensor *t = pln_safetensors_find(st, name);
    if (!t) { fprintf(stderr, "%s: no tensor %s\n", st->path, name); exit(2); }
    return t;
}

static inline int ref_open(ref_t *r, const char *path) {
    memset(r, 0, sizeof *r);
    if (pln_safetensors_open(&r->st, path)) { fprintf(stderr, "%s\n", pln_error()); return -1; }
    char nm[64];
    for (int i = 0; i < NPROMPT; i++) {
        snprintf(nm, sizeof nm, "prompt%d.ids", i);
        const pln_tensor *t = ref_need(&r->st, nm);
        r->n[i] = (int32_t)t->shape[0];
        r->ids[i] = (const int32_t *)t->data;
        snprintf(nm, sizeof nm, "prompt%d.logits", i);
        r->logits[i] = (const float *)ref_need(&r->st, nm)->data;
        snprintf(nm, sizeof nm, "greedy%d.ids", i);
        t = ref_need(&r->st, nm);
        r->gids[i] = (const int32_t *)t->data;
        r->gn[i] = (int32_t)t->shape[0];
        snprintf(nm, sizeof nm, "greedy%d.logprobs", i);
        r->glp[i] = (const float *)ref_need(&r->st, nm)->data;
    }
    const pln_tensor *b = ref_need(&r->st, "batch.ids");
    r->B = b->shape[0];
    r->L = b->shape[1];
    r->bids = (const int32_t *)b->data;
    r->bmask = (const int32_t *)ref_need(&r->st, "batch.mask")->data;
    r->blogits = (const float *)ref_need(&r->st, "batch.logits")->data;
    return 0;
}

#endif
