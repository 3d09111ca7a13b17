/* jinja.h — pollen's own Jinja engine for chat templates: renders a template byte for byte as
 * jinja2's ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=
 * [loopcontrols]) does under transformers' apply_chat_template (its tojson, raise_exception and
 * strftime_now). The subset it implements, and what it refuses, is docs/JINJA.md.
 *
 * It is a sandbox: a render is bounded in loop steps, output bytes, memory and call depth; going
 * over a bound is an error, never a hang or a crash. Every error names the template and line.
 *
 * Error convention: functions return 0 / a valid pointer, or -1 / NULL after pln_errorf(); the
 * message reads "NAME:LINE: what went wrong". A parsed template is immutable: any number of
 * threads may render one at once. */
#ifndef PLN_JINJA_H
#define PLN_JINJA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pln_jinja pln_jinja;

/* Parses len bytes of template source (UTF-8). name (copied) is what errors call the template,
 * e.g. a file path. NULL + error "NAME:LINE: ..." on a syntax error or a construct pollen does
 * not implement (the error names it). */
pln_jinja *pln_jinja_parse(const char *src, size_t len, const char *name);
void pln_jinja_free(pln_jinja *t);
const char *pln_jinja_name(const pln_jinja *t);

typedef struct {
    uint64_t max_steps;     /* loop iterations + statements executed (default 1,000,000) */
    size_t max_output;      /* bytes of output (default 8 MiB) */
    size_t max_memory;      /* bytes of values made while rendering (default 256 MiB) */
    int max_depth;          /* nested macro calls and expression depth (default 64) */
    int64_t now;            /* strftime_now's clock, seconds since the epoch, local time; -1: the
                               real clock. Tests fix it so renderings are reproducible. */
} pln_jinja_limits;
void pln_jinja_limits_default(pln_jinja_limits *l);

typedef enum {
    PLN_JINJA_OK = 0,
    PLN_JINJA_RAISED = 1,    /* the template called raise_exception(msg): pln_error() is msg */
    PLN_JINJA_ERROR = 2,     /* a runtime error (undefined attribute, type error, unsafe call) */
    PLN_JINJA_LIMIT = 3,     /* a sandbox bound was reached */
} pln_jinja_status;

/* Renders t with the variables of vars (a JSON object; NULL for none; jansson keeps the key order,
 * which is the order dict iteration and tojson see). On success *out is malloc'd, NUL-terminated,
 * its length in *out_len, and PLN_JINJA_OK is returned. Otherwise *out is NULL and the status
 * says why; pln_error() has the message ("NAME:LINE: ..." except for RAISED, which is the
 * template's own message). lim NULL: the defaults. */
pln_jinja_status pln_jinja_render(const pln_jinja *t, json_t *vars, const pln_jinja_limits *lim,
                                  char **out, size_t *out_len);

/* Python's json.dumps(v, ensure_ascii=False, indent=indent (<0: None), separators=None) as
 * transformers' tojson filter calls it. malloc'd; never NULL. */
char *pln_jinja_tojson(json_t *v, int indent);

#endif
