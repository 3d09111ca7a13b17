/* test_graphs.c — decode steps replayed as backend graphs, checked on the CPU.
 *
 * The CUDA backend records a decode step with stream capture and replays it as a CUDA graph; the
 * model decides when to record, when a recording is stale and when to give up. That logic is
 * backend-independent, so it is tested here with "cpu-rec": the CPU backend wrapped so that
 * graph_begin..graph_end records each op with its arguments copied by value (as a kernel launch
 * is captured) and graph_launch replays them. Like a capture, the recorder refuses allocations,
 * uploads, downloads and syncs while recording. A replay that used a buffer the model had since
 * reallocated would read freed memory (caught under SANITIZE=address).
 *
 * Checked: greedy decoding with graphs equals the plain CPU backend bit for bit and the
 * transformers greedy ids; batches that shrink and grow, a long prompt that grows the scratch in
 * the middle, a backend epoch change, a recording that fails (everything falls back to op by op,
 * same results), PLN_GRAPHS=0, and an int8 set. */
#include "tests/test.h"
#include "tests/fixture_ref.h"
#include "tests/fixture_set.h"
#include "kernels/backend.h"
#include "runtime/comm.h"
#include "runtime/engine.h"

#define V 1003
#define MAX_OPS 4096

typedef enum { OP_EMBED, OP_LN, OP_RLN, OP_LINEAR, OP_KV, OP_ATTN, OP_GATHER, OP_LOGITS } op_kind;

typedef struct {
    op_kind kind;
    void *out, *x;
    const void *in, *y, *qkv, *kc, *vc;
    const uint16_t *g, *b, *bias, *table;
    const int32_t *ids;
    const float *slopes;
    int32_t T, nh, hd;
    int64_t H, v0, vn;
    float eps;
    pln_epilogue epi;
    pln_weight W;
    pln_attn_meta meta;
} rec_op;

typedef struct { rec_op *ops; int n; } rec_graph;

typedef struct {
    pln_backend be;             /* first: the wrapper's table */
    pln_backend *inner;
    bool recording;
    rec_graph *cur;
    int n_cur;
    int record_fail;            /* refusals while recording (alloc, upload, ...) */
    uint64_t epoch;
    int fail_record_op;         /* > 0: the N-th op recorded fails (test knob) */
    int ops_recorded;
    int fail_at_begin;          /* record_fail when this recording began */
    int n_begin, n_end, n_launch, n_replayed_ops;
} rec_be;

static rec_be *g_rec;           /* the last cpu-rec backend made */

#define R(be) ((rec_be *)(be))
#define IN(be) (R(be)->inner)

static int refuse(pln_backend *be, const char *what) {
    R(be)->record_fail++;
    return pln_errorf("cpu-rec: %s while recording a graph", what);
}

static void *rb_alloc(pln_backend *be, size_t n) {
    if (R(be)->recording) { refuse(be, "alloc"); return NULL; }
    return IN(be)->alloc(IN(be), n);
}
static void rb_free(pln_backend *be, void *p) { IN(be)->free(IN(be), p); }
static int rb_upload(pln_backend *be, void *d, const void *s, size_t n) {
    if (R(be)->recording) return refuse(be, "upload");
    return IN(be)->upload(IN(be), d, s, n);
}
static int rb_download(pln_backend *be, void *d, const void *s, size_t n) {
    if (R(be)->recording) return refuse(be, "download");
    return IN(be)->download(IN(be), d, s, n);
}
static int rb_memset0(pln_backend *be, void *d, size_t n) {
    if (R(be)->recording) return refuse(be, "memset");
    return IN(be)->memset0(IN(be), d, n);
}
static int rb_sync(pln_backend *be) {
    if (R(be)->recording) return refuse(be, "sync");
    return IN(be)->sync(IN(be));
}
static const void *rb_weights_from_host(pln_backend *be, void *dst, const void *src, size_t n) {
    return IN(be)->weights_from_host(IN(be), dst, src, n);
}

static int run_op(pln_backend *in, const rec_op *o) {
    switch (o->kind) {
    case OP_EMBED: return in->embed(in, o->out, o->ids, o->T, o->table, o->v0, o->vn, o->H);
    case OP_LN: return in->layernorm(in, o->out, o->in, o->g, o->b, o->T, o->H, o->eps);
    case OP_RLN: return in->residual_layernorm(in, o->x, o->y, o->bias, o->g, o->b, o->out, o->T, o->H, o->eps);
    case OP_LINEAR: return in->linear(in, o->out, o->in, &o->W, o->bias, o->T, o->epi);
    case OP_KV: return in->kv_append(in, o->qkv, (void *)o->kc, (void *)o->vc, &o->meta, o->nh, o->hd);
    case OP_ATTN: return in->attention(in, o->out, o->qkv, o->kc, o->vc, &o->meta, o->slopes, o->nh, o->hd);
    case OP_GATHER: return in->gather_rows(in, o->out, o->in, o->ids, o->T, o->H);
    case OP_LOGITS: return in->logits(in, (float *)o->out, o->in, &o->W, o->T, o->vn);
    }
    return pln_errorf("cpu-rec: unknown op %d", (int)o->kind);
}

/* Records o (copied) while recording, else runs it. */
static int rb_op(pln_backend *be, const rec_op *o) {
    rec_be *r = R(be);
    if (!r->recording) return run_op(r->inner, o);
    r->ops_recorded++;
    if (r->fail_record_op > 0 && r->ops_recorded == r->fail_record_op)
        return pln_errorf("cpu-rec: injected failure at recorded op %d", r->ops_recorded);
    if (r->cur->n == MAX_OPS) return pln_errorf("cpu-rec: more than %d ops in one graph", MAX_OPS);
    r->cur->ops[r->cur->n++] = *o;
    return 0;
}

static int rb_embed(pln_backend *be, void *out, const int32_t *ids, int32_t T, const uint16_t *table, int64_t v0,
                    int64_t vn, int64_t H) {
    rec_op o = {.kind = OP_EMBED, .out = out, .ids = ids, .T = T, .table = table, .v0 = v0, .vn = vn, .H = H};
    return rb_op(be, &o);
}
static int rb_layernorm(pln_backend *be, void *out, const void *in, const uint16_t *g, const uint16_t *b, int32_t T,
                        int64_t H, float eps) {
    rec_op o = {.kind = OP_LN, .out = out, .in = in, .g = g, .b = b, .T = T, .H = H, .eps = eps};
    return rb_op(be, &o);
}
static int rb_rln(pln_backend *be, void *x, const void *y, const uint16_t *bias, const uint16_t *g, const uint16_t *b,
                  void *ln_out, int32_t T, int64_t H, float eps) {
    rec_op o = {.kind = OP_RLN, .x = x, .y = y, .bias = bias, .g = g, .b = b, .out = ln_out, .T = T, .H = H, .eps = eps};
    return rb_op(be, &o);
}
static int rb_linear(pln_backend *be, void *out, const void *in, const pln_weight *W, const uint16_t *bias, int32_t T,
                     pln_epilogue epi) {
    rec_op o = {.kind = OP_LINEAR, .out = out, .in = in, .W = *W, .bias = bias, .T = T, .epi = epi};
    return rb_op(be, &o);
}
static int rb_kv_append(pln_backend *be, const void *qkv, void *kc, void *vc, const pln_attn_meta *m, int32_t nh,
                        int32_t hd) {
    rec_op o = {.kind = OP_KV, .qkv = qkv, .kc = kc, .vc = vc, .meta = *m, .nh = nh, .hd = hd};
    return rb_op(be, &o);
}
static int rb_attention(pln_backend *be, void *out, const void *qkv, const void *kc, const void *vc,
                        const pln_attn_meta *m, const float *slopes, int32_t nh, int32_t hd) {
    rec_op o = {.kind = OP_ATTN, .out = out, .qkv = qkv, .kc = kc, .vc = vc, .meta = *m, .slopes = slopes, .nh = nh, .hd = hd};
    return rb_op(be, &o);
}
static int rb_gather(pln_backend *be, void *out, const void *in, const int32_t *rows, int32_t n, int64_t H) {
    rec_op o = {.kind = OP_GATHER, .out = out, .in = in, .ids = rows, .T = n, .H = H};
    return rb_op(be, &o);
}
static int rb_logits(pln_backend *be, float *out, const void *x, const pln_weight *W, int32_t S, int64_t n_valid) {
    rec_op o = {.kind = OP_LOGITS, .out = out, .in = x, .W = *W, .T = S, .vn = n_valid};
    return rb_op(be, &o);
}
static int rb_logit_process(pln_backend *be, float *l, int64_t v0, int64_t vn, const pln_logit_proc *p) {
    if (R(be)->recording) return refuse(be, "logit_process");
    return IN(be)->logit_process(IN(be), l, v0, vn, p);
}
static int rb_topk(pln_backend *be, const float *l, int32_t S, int64_t vn, int64_t v0, int32_t k, float *vals,
                   int32_t *ids, float *mx, float *se) {
    if (R(be)->recording) return refuse(be, "topk");
    return IN(be)->topk(IN(be), l, S, vn, v0, k, vals, ids, mx, se);
}

static int rb_graph_begin(pln_backend *be) {
    rec_be *r = R(be);
    if (r->recording) return pln_errorf("cpu-rec: graph_begin while recording");
    r->cur = pln_xcalloc(1, sizeof *r->cur);
    r->cur->ops = pln_xmalloc(MAX_OPS * sizeof *r->cur->ops);
    r->recording = true;
    r->ops_recorded = 0;
    r->fail_at_begin = r->record_fail;
    r->n_begin++;
    return 0;
}
static void rb_graph_free(pln_backend *be, void *g) {
    rec_graph *rg = g;
    if (rg) { free(rg->ops); free(rg); }
}
static int rb_graph_end(pln_backend *be, void **g) {
    rec_be *r = R(be);
    if (!r->recording) return pln_errorf("cpu-rec: graph_end without graph_begin");
    r->recording = false;
    r->n_end++;
    rec_graph *got = r->cur;
    r->cur = NULL;
    /* Like a capture invalidated by a refused call: the recording is unusable. */
    if (r->record_fail != r->fail_at_begin || (r->fail_record_op > 0 && r->ops_recorded >= r->fail_record_op)) {
        rb_graph_free(be, got);
        return pln_errorf("cpu-rec: the recording failed");
    }
    rb_graph_free(be, *g);   /* "update in place": the new recording replaces the old */
    *g = got;
    return 0;
}
static int rb_graph_launch(pln_backend *be, void *g) {
    rec_be *r = R(be);
    rec_graph *rg = g;
    if (!rg) return pln_errorf("cpu-rec: launch of no graph");
    r->n_launch++;
    for (int i = 0; i < rg->n; i++) {
        if (run_op(r->inner, &rg->ops[i])) return -1;
        r->n_replayed_ops++;
    }
    return 0;
}
static uint64_t rb_graph_epoch(pln_backend *be) { return R(be)->epoch; }

static void rb_destroy(pln_backend *be) {
    pln_backend_destroy(IN(be));
    if (g_rec == R(be)) g_rec = NULL;
    free(be);
}

static pln_backend *rec_create(int device) {
    (void)device;
    pln_backend *in = pln_backend_cpu_create();
    if (!in) return NULL;
    rec_be *r = pln_xcalloc(1, sizeof *r);
    r->inner = in;
    pln_backend *be = &r->be;
    *be = *in;   /* sizes and dtypes */
    be->name = "cpu-rec";
    be->impl = r;
    be->alloc = rb_alloc; be->free = rb_free; be->upload = rb_upload; be->download = rb_download;
    be->memset0 = rb_memset0; be->sync = rb_sync; be->weights_from_host = rb_weights_from_host;
    be->load_file = NULL;
    be->set_kv_dtype = NULL;   /* the CPU's would treat this wrapper as its own context */
    be->set_int_dot = NULL;    /* likewise */
    be->embed = rb_embed; be->layernorm = rb_layernorm; be->residual_layernorm = rb_rln; be->linear = rb_linear;
    be->kv_append = rb_kv_append; be->attention = rb_attention; be->gather_rows = rb_gather; be->logits = rb_logits;
    be->logit_process = rb_logit_process; be->topk = rb_topk;
    be->graph_begin = rb_graph_begin; be->graph_end = rb_graph_end; be->graph_launch = rb_graph_launch;
    be->graph_free = rb_graph_free; be->graph_epoch = rb_graph_epoch;
    be->destroy = rb_destroy;
    g_rec = r;
    return be;
}

/* ---- the scenario ------------------------------------------------------------------------- */
static pln_comm *g_comm;

static pln_engine *open_set(const char *dir, const char *backend) {
    pln_engine_opts o;
    pln_engine_opts_default(&o);
    o.shard_dir = dir;
    o.backend = backend;
    o.max_seqs = 8;
    o.max_seq_len = 160;   /* max_pos buckets 128 and 160 both occur */
    o.block_size = 4;
    o.quiet = true;
    pln_engine *e = pln_engine_open(&o, g_comm);
    if (!e) fprintf(stderr, "engine open %s (%s): %s\n", dir, backend, pln_error());
    return e;
}

/* What a run produced: every step's logits rows and sampled tokens, concatenated. */
typedef struct { float *logits; size_t n_logits, cap; int32_t toks[4096]; int n_toks; } trace;

static void trace_add(trace *t, const float *l, size_t n) {
    if (t->n_logits + n > t->cap) {
        t->cap = 2 * (t->n_logits + n);
        t->logits = pln_xrealloc(t->logits, t->cap * sizeof(float));
    }
    memcpy(t->logits + t->n_logits, l, n * sizeof(float));
    t->n_logits += n;
}

typedef struct { int32_t slot, n; const int32_t *ids; int32_t last; bool live; } seqst;

/* One step over the live sequences (prefill of the not-yet-started ones: n tokens; decode of the
 * rest: their last token), greedy, logits recorded. Between steps the test flips its knobs via
 * `at_step`. */
static int step(pln_engine *e, seqst *ss, int ns, trace *t) {
    pln_step_seq s[8];
    int map[8], k = 0;
    for (int i = 0; i < ns; i++) {
        if (!ss[i].live) continue;
        memset(&s[k], 0, sizeof s[k]);
        s[k].slot = ss[i].slot;
        if (ss[i].n > 0) { s[k].n_new = ss[i].n; s[k].tokens = ss[i].ids; }
        else { s[k].n_new = 1; s[k].tokens = &ss[i].last; }
        s[k].sample = true;
        pln_sample_params_default(&s[k].params);
        map[k++] = i;
    }
    pln_step_plan p = {.n_seqs = k, .seqs = s, .want_logits = true};
    pln_step_out o[8];
    if (pln_engine_step(e, &p, o)) { fprintf(stderr, "step: %s\n", pln_error()); return -1; }
    for (int j = 0; j < k; j++) {
        seqst *q = &ss[map[j]];
        trace_add(t, o[j].logits, (size_t)s[j].n_new * V);
        if (t->n_toks < 4096) t->toks[t->n_toks++] = o[j].token;
        q->last = o[j].token;
        q->n = 0;
    }
    return 0;
}

static int32_t g_long[124];

/* The scenario, on backend `backend`: prompts 0..2 prefilled together (step 0), 12 decode steps
 * at batch 3, prompt 1 released, 6 steps at batch 2, a 124-token prompt joins (step 19: its
 * prefill grows the model's scratch), 8 decode steps at batch 3 whose max_pos crosses 128 at
 * step 24. knob(step, be) runs before each step. */
static int scenario(const char *dir, const char *backend, const ref_t *r, trace *t,
                    void (*knob)(int step_no, rec_be *rb)) {
    pln_engine *e = open_set(dir, backend);
    if (!e) return -1;
    seqst ss[4] = {
        {.slot = 0, .n = r->n[0], .ids = r->ids[0], .live = true},
        {.slot = 1, .n = r->n[1], .ids = r->ids[1], .live = true},
        {.slot = 2, .n = r->n[2], .ids = r->ids[2], .live = true},
        {.slot = 3, .n = 124, .ids = g_long, .live = false},
    };
    int rc = 0, no = 0;
    for (int i = 0; i < 13 && !rc; i++, no++) { if (knob) knob(no, g_rec); rc = step(e, ss, 4, t); }
    if (!rc) {
        int32_t rel = 1;
        pln_step_plan p = {.n_release = 1, .release = &rel};
        rc = pln_engine_step(e, &p, NULL);
        ss[1].live = false;
    }
    for (int i = 0; i < 6 && !rc; i++, no++) { if (knob) knob(no, g_rec); rc = step(e, ss, 4, t); }
    ss[3].live = true;
    for (int i = 0; i < 9 && !rc; i++, no++) { if (knob) knob(no, g_rec); rc = step(e, ss, 4, t); }
    pln_engine_close(e);
    return rc;
}

static void knob_none(int no, rec_be *rb) { (void)no; (void)rb; }
static void knob_epoch(int no, rec_be *rb) { if (rb && (no == 5 || no == 22)) rb->epoch++; }
static void knob_fail(int no, rec_be *rb) { if (rb && no == 0) rb->fail_record_op = 7; }

static bool same_trace(const trace *a, const trace *b, const char *what) {
    bool same = a->n_logits == b->n_logits && a->n_toks == b->n_toks &&
                !memcmp(a->logits, b->logits, a->n_logits * sizeof(float)) &&
                !memcmp(a->toks, b->toks, (size_t)a->n_toks * sizeof(int32_t));
    double rel = a->n_logits == b->n_logits ? test_rel_l2(a->logits, b->logits, a->n_logits) : 1;
    printf("%-44s %zu logits, %d tokens: %s (rel L2 %.3g)\n", what, a->n_logits, a->n_toks,
           same ? "identical to op by op" : "DIFFER", rel);
    CHECK(same, "%s: differs from the plain CPU backend (rel L2 %.3g)", what, rel);
    return same;
}

static void check_set(const char *label, const char *dir, const ref_t *r, bool check_greedy) {
    trace base = {0}, t = {0};
    setenv("PLN_GRAPHS", "1", 1);
    CHECK(scenario(dir, "cpu", r, &base, NULL) == 0, "%s: op-by-op scenario runs", label);
    char what[128];

    if (check_greedy) {
        /* The first decode steps of prompt 0 are transformers' greedy continuation. */
        bool ok = true;
        for (int s = 0; s < 8; s++) {
            int32_t tok = base.toks[3 * s];   /* steps 0..12 have 3 sequences in order 0,1,2 */
            if (tok != r->gids[0][r->n[0] + s]) ok = false;
        }
        CHECK(ok, "%s: greedy continuation of prompt 0 equals transformers'", label);
    }

    /* 1. graphs on, nothing special. */
    CHECK(scenario(dir, "cpu-rec", r, &t, knob_none) == 0, "%s: graph scenario runs", label);
    snprintf(what, sizeof what, "%s: graphs", label);
    same_trace(&t, &base, what);
    /* every scenario leaves g_rec NULL (destroyed); the stats are read in the knob instead */
    free(t.logits); memset(&t, 0, sizeof t);

    /* 2. epoch bumps force re-recording. */
    CHECK(scenario(dir, "cpu-rec", r, &t, knob_epoch) == 0, "%s: epoch scenario runs", label);
    snprintf(what, sizeof what, "%s: graphs, backend epoch bumped", label);
    same_trace(&t, &base, what);
    free(t.logits); memset(&t, 0, sizeof t);

    /* 3. the first recording fails: op by op from then on. */
    CHECK(scenario(dir, "cpu-rec", r, &t, knob_fail) == 0, "%s: failed-recording scenario runs", label);
    snprintf(what, sizeof what, "%s: graphs, first recording fails", label);
    same_trace(&t, &base, what);
    free(t.logits); memset(&t, 0, sizeof t);
    free(base.logits);
}

/* Stats of one run, collected by a knob that also copies the counters at the last step. */
static struct { int n_begin, n_end, n_launch, record_fail; } g_last;
static void knob_stats(int no, rec_be *rb) {
    if (!rb) return;
    g_last.n_begin = rb->n_begin; g_last.n_end = rb->n_end; g_last.n_launch = rb->n_launch;
    g_last.record_fail = rb->record_fail;
    (void)no;
}
static void knob_fail_stats(int no, rec_be *rb) { knob_fail(no, rb); knob_stats(no, rb); }

/* The counts. Steps 0 and 19 hold prefills (op by op). Decode shapes (T, max_pos bound):
 * (3,128) steps 1..12: 1 op by op, 2 records, 3..12 replay; (2,128) 13..18: 13 op by op, 14
 * records, 15..18 replay; (3,128) again 20..23: step 19 grew the scratch, so 20 records anew,
 * 21..23 replay; (3,160) 24..27 (max_seq_len 160 caps the bound 256): 24 op by op, 25 records,
 * 26..27 replay. Before step 27: 4 recordings, 11 + 5 + 4 + 2 = 22 replays. */
static void check_counts(const char *dir, const ref_t *r) {
    trace t = {0};
    memset(&g_last, 0, sizeof g_last);
    CHECK(scenario(dir, "cpu-rec", r, &t, knob_stats) == 0, "counts scenario runs");
    /* knob_stats ran before the last step: launches counted up to step 26. */
    printf("graphs: %d recorded, %d replayed before the last step, %d refusals\n", g_last.n_end, g_last.n_launch,
           g_last.record_fail);
    CHECK(g_last.n_end == 4, "4 recordings (got %d)", g_last.n_end);
    CHECK(g_last.n_launch == 22, "22 replays before the last step (got %d)", g_last.n_launch);
    CHECK(g_last.record_fail == 0, "nothing was refused while recording (got %d)", g_last.record_fail);
    free(t.logits); memset(&t, 0, sizeof t);

    memset(&g_last, 0, sizeof g_last);
    CHECK(scenario(dir, "cpu-rec", r, &t, knob_fail_stats) == 0, "failed-recording counts scenario runs");
    CHECK(g_last.n_end == 1 && g_last.n_launch == 0, "after a failed recording nothing is recorded or replayed "
          "(recorded %d, replayed %d)", g_last.n_end, g_last.n_launch);
    free(t.logits); memset(&t, 0, sizeof t);

    setenv("PLN_GRAPHS", "0", 1);
    memset(&g_last, 0, sizeof g_last);
    CHECK(scenario(dir, "cpu-rec", r, &t, knob_stats) == 0, "PLN_GRAPHS=0 scenario runs");
    CHECK(g_last.n_begin == 0 && g_last.n_launch == 0, "PLN_GRAPHS=0: no recording (%d), no replay (%d)",
          g_last.n_begin, g_last.n_launch);
    setenv("PLN_GRAPHS", "1", 1);
    free(t.logits);
}

int main(int argc, char **argv) {
    test_begin("test_graphs");
    g_comm = pln_comm_init(&argc, &argv);
    if (!fixture_can_reshard()) {
        printf("SKIP: this build has no `pollen reshard` (needed to make shard sets from the fixtures)\n");
        pln_comm_free(g_comm);
        return test_done();
    }
    CHECK(pln_backend_register("cpu-rec", rec_create) == 0, "register cpu-rec: %s", pln_error());
    CHECK(pln_backend_register("cpu-rec", rec_create) != 0, "a second registration of cpu-rec is refused");
    CHECK(pln_backend_register("cuda", rec_create) != 0, "a built-in name cannot be registered");
    for (int i = 0; i < 124; i++) g_long[i] = (int32_t)((i * 37 + 11) % (V - 3)) + 3;

    ref_t r;
    if (ref_open(&r, "tests/fixtures/models/bloom-4h/reference-f16.safetensors")) {
        CHECK(0, "reference opens");
        return test_done();
    }
    char *f16 = fixture_reshard("bloom-4h", "fp16-st", 1, "fp16");
    CHECK(f16 != NULL, "reshard bloom-4h fp16");
    if (f16) {
        check_set("bloom-4h fp16", f16, &r, true);
        check_counts(f16, &r);
    }
    char *i8 = fixture_reshard("bloom-4h", "fp16-st", 1, "int8");
    CHECK(i8 != NULL, "reshard bloom-4h int8");
    if (i8) check_set("bloom-4h int8", i8, &r, false);
    free(f16);
    free(i8);
    pln_safetensors_close(&r.st);
    pln_comm_free(g_comm);
    return test_done();
}
