/* test_jinja.c — pollen's Jinja engine against jinja2 3.1.6 with transformers' settings:
 * every construct by itself (tests/fixtures/jinja_cases.json) and the real chat templates in
 * tests/fixtures/templates/ rendered for several conversations each (expected.json), byte for
 * byte, errors included (raise_exception's message exactly). Both fixtures are written by
 * tests/fixtures/make_templates.py. Then what jinja2 cannot show: the sandbox's bounds and the
 * error messages (template line, the construct refused). */
#include "test.h"

#include "formats/common.h"
#include "runtime/jinja.h"

#include <jansson.h>

#define FIX_CASES "tests/fixtures/jinja_cases.json"
#define FIX_TPL_DIR "tests/fixtures/templates"

static void show_diff(const char *got, size_t gn, const char *want, size_t wn) {
    size_t i = 0;
    while (i < gn && i < wn && got[i] == want[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "  first difference at byte %zu\n  got:  %.*s\n  want: %.*s\n", i,
            (int)((gn - from) > 160 ? 160 : gn - from), got + from, (int)((wn - from) > 160 ? 160 : wn - from), want + from);
}

/* Checks one rendering against a fixture entry {"output"} or {"error", "message"}. */
static void check_render(const char *what, const char *src, size_t srcn, json_t *vars, json_t *want, int64_t now) {
    pln_jinja_limits lim;
    pln_jinja_limits_default(&lim);
    lim.now = now;
    json_t *wout = json_object_get(want, "output");
    const char *werr = json_string_value(json_object_get(want, "error"));
    const char *wmsg = json_string_value(json_object_get(want, "message"));
    pln_jinja *t = pln_jinja_parse(src, srcn, what);
    if (!t) {
        CHECK(werr && !strcmp(werr, "syntax"), "%s: parse failed (%s), jinja2 %s", what, pln_error(),
              werr ? werr : "renders it");
        return;
    }
    char *out = NULL; size_t n = 0;
    pln_jinja_status st = pln_jinja_render(t, vars, &lim, &out, &n);
    if (wout) {
        const char *w = json_string_value(wout);
        size_t wn = json_string_length(wout);
        bool ok = st == PLN_JINJA_OK && n == wn && !memcmp(out, w, n);
        CHECK(ok, "%s: rendering differs from jinja2's%s%s", what, st ? ": " : "", st ? pln_error() : "");
        if (!ok && st == PLN_JINJA_OK) show_diff(out, n, w, wn);
    } else if (!strcmp(werr, "raise")) {
        CHECK(st == PLN_JINJA_RAISED && !strcmp(pln_error(), wmsg), "%s: want raise_exception(\"%s\"), got status %d: %s",
              what, wmsg, (int)st, st ? pln_error() : out);
    } else if (!strcmp(werr, "syntax")) {
        CHECK(0, "%s: parsed, but jinja2 refuses it: %s", what, wmsg);
    } else {
        CHECK(st == PLN_JINJA_ERROR || st == PLN_JINJA_LIMIT, "%s: want an error like jinja2's (%s), got status %d: %s",
              what, wmsg, (int)st, st ? pln_error() : out);
    }
    free(out);
    pln_jinja_free(t);
}

static void test_cases(void) {
    json_error_t je;
    json_t *root = json_load_file(FIX_CASES, 0, &je);
    CHECK(root != NULL, "%s: %s", FIX_CASES, je.text);
    if (!root) return;
    int64_t now = json_integer_value(json_object_get(root, "now"));
    json_t *cases = json_object_get(root, "cases"), *cs;
    size_t i;
    CHECK(json_array_size(cases) > 100, "only %zu cases", json_array_size(cases));
    json_array_foreach(cases, i, cs) {
        json_t *src = json_object_get(cs, "template");
        check_render(json_string_value(json_object_get(cs, "name")), json_string_value(src), json_string_length(src),
                     json_object_get(cs, "vars"), cs, now);
    }
    json_decref(root);
}

static void test_real_templates(void) {
    json_error_t je;
    json_t *root = json_load_file(FIX_TPL_DIR "/expected.json", 0, &je);
    CHECK(root != NULL, "%s/expected.json: %s", FIX_TPL_DIR, je.text);
    if (!root) return;
    int64_t now = json_integer_value(json_object_get(root, "now"));
    json_t *convs = json_object_get(root, "conversations"), *tpl;
    size_t i, n_templates = 0, n_renders = 0, n_raise = 0;
    json_array_foreach(json_object_get(root, "templates"), i, tpl) {
        const char *fn = json_string_value(json_object_get(tpl, "template"));
        char path[512];
        snprintf(path, sizeof path, "%s/%s", FIX_TPL_DIR, fn);
        size_t srcn = 0;
        char *src = pln_read_small_file(path, 1 << 20, &srcn);
        CHECK(src != NULL, "%s", pln_error());
        if (!src) continue;
        n_templates++;
        json_t *r; size_t k;
        int before = t_fail;
        json_array_foreach(json_object_get(tpl, "renders"), k, r) {
            const char *cname = json_string_value(json_object_get(r, "conversation"));
            json_t *vars = json_object();
            json_object_set(vars, "messages", json_object_get(convs, cname));
            json_object_set_new(vars, "tools", json_is_true(json_object_get(r, "tools")) ? json_incref(json_object_get(tpl, "tools")) : json_null());
            json_object_set_new(vars, "documents", json_null());
            json_object_set(vars, "add_generation_prompt", json_object_get(r, "add_generation_prompt"));
            json_object_update(vars, json_object_get(tpl, "special_tokens"));
            if (json_is_object(json_object_get(r, "kwargs"))) json_object_update(vars, json_object_get(r, "kwargs"));
            char what[600];
            snprintf(what, sizeof what, "%s [%s%s%s%s]", path, cname, json_is_true(json_object_get(r, "add_generation_prompt")) ? ", generation prompt" : "",
                     json_is_true(json_object_get(r, "tools")) ? ", tools" : "", json_object_get(r, "kwargs") ? ", kwargs" : "");
            check_render(what, src, srcn, vars, r, now);
            n_renders++;
            if (json_object_get(r, "error")) n_raise++;
            json_decref(vars);
        }
        printf("%-60s %s\n", fn, t_fail == before ? "OK" : "NOT OK");
        free(src);
    }
    printf("real templates: %zu templates, %zu renderings (%zu of them errors) checked against jinja2\n", n_templates, n_renders, n_raise);
    CHECK(n_templates >= 20, "only %zu real templates", n_templates);
    json_decref(root);
}

static pln_jinja_status render_str(const char *src, const pln_jinja_limits *lim, char **out) {
    pln_jinja *t = pln_jinja_parse(src, strlen(src), "t.jinja");
    if (!t) return (pln_jinja_status)-1;
    size_t n;
    pln_jinja_status st = pln_jinja_render(t, NULL, lim, out, &n);
    pln_jinja_free(t);
    return st;
}

static void test_sandbox_and_errors(void) {
    pln_jinja_limits lim;
    pln_jinja_limits_default(&lim);
    char *out = NULL;
    /* a loop that would run 10^10 times stops at the step bound */
    pln_jinja_status st = render_str("{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}", &lim, &out);
    CHECK(st == PLN_JINJA_LIMIT && out == NULL && strstr(pln_error(), "steps"), "step bound: %d %s", (int)st, pln_error());
    /* output bound */
    lim.max_output = 1000;
    st = render_str("{% for a in range(5000) %}ab{% endfor %}", &lim, &out);
    CHECK(st == PLN_JINJA_LIMIT && strstr(pln_error(), "1000 bytes"), "output bound: %d %s", (int)st, pln_error());
    pln_jinja_limits_default(&lim);
    /* unbounded recursion */
    st = render_str("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", &lim, &out);
    CHECK(st == PLN_JINJA_LIMIT && strstr(pln_error(), "nested deeper"), "recursion bound: %d %s", (int)st, pln_error());
    /* memory bound: doubling a string */
    lim.max_memory = 1 << 20;
    lim.max_output = 1u << 30;
    st = render_str("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}", &lim, &out);
    CHECK(st == PLN_JINJA_LIMIT && strstr(pln_error(), "memory"), "memory bound: %d %s", (int)st, pln_error());
    pln_jinja_limits_default(&lim);
    /* errors name the template and the line, and the construct */
    st = render_str("line1\n{{ 'a' }}\n{{ nothing.x }}", &lim, &out);
    CHECK(st == PLN_JINJA_ERROR && strstr(pln_error(), "t.jinja:3:") && strstr(pln_error(), "'nothing' is undefined"), "%s", pln_error());
    st = render_str("a\n\n{% include 'x.jinja' %}", &lim, &out);
    CHECK(st == (pln_jinja_status)-1 && strstr(pln_error(), "t.jinja:3:") && strstr(pln_error(), "include"), "%s", pln_error());
    st = render_str("{% if true %}\n{{ x | frobnicate }}{% endif %}", &lim, &out);
    CHECK(st == PLN_JINJA_ERROR && strstr(pln_error(), "t.jinja:2:") && strstr(pln_error(), "'frobnicate'"), "%s", pln_error());
    st = render_str("{% for x in [1] %}\n\n{% endfor", &lim, &out);
    CHECK(st == (pln_jinja_status)-1 && strstr(pln_error(), "t.jinja:"), "%s", pln_error());
    st = render_str("{% for x in [1] %}x", &lim, &out);
    CHECK(st == (pln_jinja_status)-1 && strstr(pln_error(), "never closed") && strstr(pln_error(), "endfor"), "%s", pln_error());
    st = render_str("{% set xs = [] %}\n{% set _ = xs.append(1) %}", &lim, &out);
    CHECK(st == PLN_JINJA_ERROR && strstr(pln_error(), "t.jinja:2:") && strstr(pln_error(), "'append' of 'list' object is unsafe"), "%s", pln_error());
    st = render_str("{{ raise_exception('Only user and assistant roles are supported!') }}", &lim, &out);
    CHECK(st == PLN_JINJA_RAISED && !strcmp(pln_error(), "Only user and assistant roles are supported!"), "%s", pln_error());
    /* hostile nesting is refused, not a stack overflow */
    char src[2100];
    memcpy(src, "{{ ", 3);
    memset(src + 3, '(', 1000); src[1003] = '1'; memset(src + 1004, ')', 1000);
    memcpy(src + 2004, " }}", 4);
    st = render_str(src, &lim, &out);
    CHECK(st == (pln_jinja_status)-1 && strstr(pln_error(), "nested too deeply"), "%s", pln_error());
    /* a parsed template renders again and again the same (it is immutable) */
    const char *again = "{% for m in messages %}{{ m }}{% endfor %}";
    pln_jinja *t = pln_jinja_parse(again, strlen(again), "again");
    CHECK(t != NULL, "%s", pln_error());
    if (!t) return;
    json_t *vars = json_pack("{s:[i,i,i]}", "messages", 1, 2, 3);
    for (int k = 0; k < 3; k++) {
        size_t n;
        st = pln_jinja_render(t, vars, NULL, &out, &n);
        CHECK(st == PLN_JINJA_OK && !strcmp(out, "123"), "render %d: %s", k, out ? out : pln_error());
        free(out);
    }
    json_decref(vars);
    pln_jinja_free(t);
    /* tojson of JSON values, as the chat route uses it */
    json_t *j = json_pack("{s:s,s:[i,f,n]}", "é", "\"x\"\n", "b", 1, 0.5);
    char *s = pln_jinja_tojson(j, -1);
    CHECK(!strcmp(s, "{\"é\": \"\\\"x\\\"\\n\", \"b\": [1, 0.5, null]}"), "tojson: %s", s);
    free(s);
    json_decref(j);
}

int main(void) {
    test_begin("test_jinja");
    test_cases();
    test_real_templates();
    test_sandbox_and_errors();
    return test_done();
}
