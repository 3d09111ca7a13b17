/* opt.c — the table-driven option parser and help generator of every command; see opt.h. */
#include "tools/opt.h"
#include "formats/common.h"
#include "tools/cli.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define HELP_WIDTH 100    /* help lines wrap here */
#define HELP_MAX_COL 36   /* the description column: the widest option that fits, plus two */

int pln_opt_env_rank(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

int pln_opt_edit_distance(const char *a, const char *b) {
    /* optimal string alignment: insertions, deletions, substitutions and swaps of two neighbours
     * (the commonest typo) cost one each */
    size_t la = strlen(a), lb = strlen(b), w = lb + 1;
    int *d = pln_xcalloc((la + 1) * w, sizeof *d);
    for (size_t i = 0; i <= la; i++) d[i * w] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int best = d[(i - 1) * w + j - 1] + (a[i - 1] != b[j - 1]);
            if (d[(i - 1) * w + j] + 1 < best) best = d[(i - 1) * w + j] + 1;
            if (d[i * w + j - 1] + 1 < best) best = d[i * w + j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[(i - 2) * w + j - 2] + 1 < best)
                best = d[(i - 2) * w + j - 2] + 1;
            d[i * w + j] = best;
        }
    int r = d[la * w + lb];
    free(d);
    return r;
}

static FILE *err_of(const pln_opt_cmd *c) { return c->err ? c->err : stderr; }
static FILE *out_of(const pln_opt_cmd *c) { return c->out ? c->out : stdout; }

int pln_opt_usage_error(const pln_opt_cmd *c, const char *fmt, ...) {
    if (c->rank != 0) return 2;
    FILE *f = err_of(c);
    va_list ap;
    va_start(ap, fmt);
    fprintf(f, "pollen %s: ", c->cmd);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fprintf(f, " (see pollen %s --help)\n", c->cmd);
    return 2;
}

/* A bad value: the checked parsers' own message, once. */
static int value_error(const pln_opt_cmd *c, const char *env) {
    if (c->rank != 0) return -1;
    if (env) fprintf(err_of(c), "pollen: %s: %s\n", env, pln_error());
    else fprintf(err_of(c), "pollen: %s\n", pln_error());
    return -1;
}

pln_opt *pln_opt_find(pln_opt_cmd *c, const char *name) {
    for (pln_opt *o = c->opts; o->name; o++)
        if (o->kind != PLN_OPT_POS && !strcmp(o->name, name)) return o;
    return NULL;
}

bool pln_opt_given(pln_opt_cmd *c, const char *name) {
    pln_opt *o = pln_opt_find(c, name);
    return o && o->given > 0;
}

/* Whether `name` (len bytes) is one of the comma-separated aliases. */
static bool alias_match(const char *aliases, const char *name, size_t len) {
    for (const char *p = aliases; p && *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == len && !strncmp(p, name, len)) return true;
        p = e ? e + 1 : p + n;
    }
    return false;
}

static pln_opt *find_long(pln_opt_cmd *c, const char *name, size_t len) {
    for (pln_opt *o = c->opts; o->name; o++) {
        if (o->kind == PLN_OPT_POS) continue;
        if ((strlen(o->name) == len && !strncmp(o->name, name, len)) || alias_match(o->aliases, name, len)) return o;
    }
    return NULL;
}

static pln_opt *find_short(pln_opt_cmd *c, char s) {
    for (pln_opt *o = c->opts; o->name; o++)
        if (o->kind != PLN_OPT_POS && o->short_name == s) return o;
    return NULL;
}

/* The closest long name or alias to `name` (len bytes), when it is close enough to be a typo.
 * Returns the candidate (inside the table's strings) and its length in *n. */
static const char *suggest(pln_opt_cmd *c, const char *name, size_t len, int *n) {
    char *given = pln_xasprintf("%.*s", (int)len, name);
    const char *best = NULL;
    int best_d = 1 << 30, best_n = 0;
    char cand[128];
    for (pln_opt *o = c->opts; o->name; o++) {
        if (o->kind == PLN_OPT_POS || (o->flags & PLN_OPT_HIDDEN)) continue;
        const char *p = o->name;
        size_t cl = strlen(p);
        const char *rest = o->aliases;
        for (;;) {
            if (cl < sizeof cand) {
                memcpy(cand, p, cl);
                cand[cl] = 0;
                int d = pln_opt_edit_distance(given, cand);
                if (d < best_d) { best_d = d; best = p; best_n = (int)cl; }
            }
            if (!rest || !*rest) break;
            const char *e = strchr(rest, ',');
            p = rest;
            cl = e ? (size_t)(e - rest) : strlen(rest);
            rest = e ? e + 1 : rest + cl;
        }
    }
    free(given);
    /* a typo: one or two edits, and no more than a third of the name */
    if (!best || best_d > 2 || (size_t)best_d * 3 > len) return NULL;
    *n = best_n;
    return best;
}

/* Stores an integer into a destination of its own size. */
static void store_int(pln_opt *o, int64_t v) {
    switch (o->dst_size) {
    case 1: *(int8_t *)o->dst = (int8_t)v; break;
    case 2: *(int16_t *)o->dst = (int16_t)v; break;
    case 4: *(int32_t *)o->dst = (int32_t)v; break;
    default: *(int64_t *)o->dst = v; break;
    }
}

static int64_t load_int(const pln_opt *o) {
    switch (o->dst_size) {
    case 1: return *(const int8_t *)o->dst;
    case 2: return *(const int16_t *)o->dst;
    case 4: return *(const int32_t *)o->dst;
    default: return *(const int64_t *)o->dst;
    }
}

static bool in_choices(const char *choices, const char *v) {
    size_t len = strlen(v);
    for (const char *p = choices; p && *p;) {
        const char *e = strchr(p, '|');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == len && !strncmp(p, v, len)) return true;
        p = e ? e + 1 : p + n;
    }
    return false;
}

/* Applies one value to an option; "--name" as the user wrote it names it in messages. env: the
 * variable it came from, or NULL. 0, or -1 after printing the error. */
static int apply(pln_opt_cmd *c, pln_opt *o, const char *opt, const char *val, const char *env) {
    switch (o->kind) {
    case PLN_OPT_FLAG:
        *(bool *)o->dst = true;
        break;
    case PLN_OPT_STR:
    case PLN_OPT_POS:
        *(const char **)o->dst = val;
        break;
    case PLN_OPT_INT: {
        int64_t v = 0;
        if (pln_cli_parse_int(opt, val, o->ilo, o->ihi, &v)) return value_error(c, env);
        store_int(o, v);
        break;
    }
    case PLN_OPT_FLOAT: {
        double v = 0;
        if (pln_cli_parse_float(opt, val, o->flo, o->lo_incl, o->fhi, &v)) return value_error(c, env);
        if (o->dst_size == sizeof(float)) *(float *)o->dst = (float)v;
        else *(double *)o->dst = v;
        break;
    }
    case PLN_OPT_ENUM:
        if (!in_choices(o->choices, val)) {
            /* "expected fp16, int8 or int4" */
            char *alts = pln_xstrdup(o->choices), *save = NULL, *list = pln_xstrdup("");
            const char *last = strrchr(o->choices, '|');
            for (char *t = strtok_r(alts, "|", &save); t; t = strtok_r(NULL, "|", &save)) {
                bool final = last && !strcmp(t, last + 1) && *list;
                char *n = pln_xasprintf("%s%s%s", list, !*list ? "" : final ? " or " : ", ", t);
                free(list);
                list = n;
            }
            pln_errorf("%s \"%s\": expected %s", opt, val, list);
            free(list);
            free(alts);
            return value_error(c, env);
        }
        *(const char **)o->dst = val;
        break;
    case PLN_OPT_LIST: {
        pln_opt_list *l = o->dst;
        l->v = pln_xrealloc(l->v, (size_t)(l->n + 1) * sizeof *l->v);
        l->v[l->n++] = val;
        break;
    }
    case PLN_OPT_FN:
        if (o->fn(opt, val, o->dst)) return value_error(c, env);
        break;
    }
    o->given++;
    snprintf(o->spelled, sizeof o->spelled, "%s", env ? env : opt);
    return 0;
}

static bool takes_value(const pln_opt *o) { return o->kind != PLN_OPT_FLAG; }

static int unknown(pln_opt_cmd *c, const char *arg) {
    if (c->rank != 0) return -1;
    FILE *f = err_of(c);
    const char *s = NULL;
    int sn = 0;
    int n = (int)strlen(arg);
    if (arg[0] == '-' && arg[1] == '-') {
        const char *name = arg + 2, *eq = strchr(name, '=');
        if (eq) n = (int)(eq - arg);
        s = suggest(c, name, eq ? (size_t)(eq - name) : strlen(name), &sn);
    }
    if (s) fprintf(f, "pollen %s: unknown option %.*s (did you mean --%.*s?)\n", c->cmd, n, arg, sn, s);
    else fprintf(f, "pollen %s: unknown option %.*s\n", c->cmd, n, arg);
    fprintf(f, "see pollen %s --help\n", c->cmd);
    return -1;
}

/* The default as help shows it: dst's value before anything is parsed. */
static char *default_text(const pln_opt *o) {
    switch (o->kind) {
    case PLN_OPT_INT: return pln_xasprintf("%lld", (long long)load_int(o));
    case PLN_OPT_FLOAT:
        return pln_xasprintf("%g", o->dst_size == sizeof(float) ? (double)*(const float *)o->dst : *(const double *)o->dst);
    case PLN_OPT_STR:
    case PLN_OPT_ENUM: {
        const char *s = *(const char *const *)o->dst;
        return pln_xstrdup(s ? s : "none");
    }
    default: return pln_xstrdup("");
    }
}

/* The positional an option fills (`-m SET`), or NULL. */
static pln_opt *pos_of(pln_opt_cmd *c, const pln_opt *o) {
    for (pln_opt *p = c->opts; p->name; p++)
        if (p->kind == PLN_OPT_POS && p != o && p->dst == o->dst) return p;
    return NULL;
}

static void prepare(pln_opt_cmd *c) {
    for (pln_opt *o = c->opts; o->name; o++) {
        o->given = 0;
        o->from_env = false;
        free(o->def);
        o->def = default_text(o);
        free(o->env_name);
        o->env_name = NULL;
        if (o->kind == PLN_OPT_POS || (o->flags & (PLN_OPT_HIDDEN | PLN_OPT_NOENV))) continue;
        if (o->env) {
            o->env_name = pln_xstrdup(o->env);
        } else if (c->env_prefix) {
            o->env_name = pln_xasprintf("%s%s", c->env_prefix, o->name);
            for (char *p = o->env_name + strlen(c->env_prefix); *p; p++)
                *p = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
        }
    }
}

static int from_env(pln_opt_cmd *c) {
    for (pln_opt *o = c->opts; o->name; o++) {
        if (o->given || !o->env_name) continue;
        pln_opt *p = pos_of(c, o);
        if (p && p->given) continue;   /* SET on the command line wins over POLLEN_MODEL */
        const char *v = getenv(o->env_name);
        if (!v) continue;
        char *opt = pln_xasprintf("--%s", o->name);
        int rc = 0;
        if (o->kind == PLN_OPT_FLAG) {
            if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")) {
                rc = apply(c, o, opt, v, o->env_name);
            } else if (!(!*v || !strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
                         !strcasecmp(v, "off"))) {
                if (c->rank == 0)
                    fprintf(err_of(c), "pollen %s: %s=%s: %s is a flag: set it to 1/true/yes/on or 0/false/no/off\n",
                            c->cmd, o->env_name, v, opt);
                rc = -1;
            }
        } else {
            rc = apply(c, o, opt, v, o->env_name);
        }
        free(opt);
        if (rc) return -1;
        if (o->given) o->from_env = true;
    }
    return 0;
}

int pln_opt_parse(pln_opt_cmd *c, int argc, char **argv) {
    prepare(c);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            if (c->rank == 0) pln_opt_help(c, out_of(c));
            return PLN_OPT_HELP;
        }
        /* the value of an option that takes one is not an option: skip it */
        const char *a = argv[i];
        pln_opt *o = NULL;
        if (a[0] == '-' && a[1] == '-' && !strchr(a, '=')) o = find_long(c, a + 2, strlen(a + 2));
        else if (a[0] == '-' && a[1] && a[1] != '-' && !a[2]) o = find_short(c, a[1]);
        if (o && takes_value(o)) i++;
    }
    bool opts_done = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opts_done || a[0] != '-' || !a[1]) {
            pln_opt *p = NULL;
            for (pln_opt *q = c->opts; q->name; q++)
                if (q->kind == PLN_OPT_POS && !q->given) { p = q; break; }
            if (!p) {
                pln_opt_usage_error(c, "unexpected argument %s", a);
                return -1;
            }
            /* filled already by its option (-m SET) */
            if (*(const char **)p->dst) {
                pln_opt_usage_error(c, "%s given twice (%s and %s)", p->name, *(const char **)p->dst, a);
                return -1;
            }
            apply(c, p, p->name, a, NULL);
            continue;
        }
        if (!strcmp(a, "--")) { opts_done = true; continue; }
        if (a[1] == '-') {
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            pln_opt *o = find_long(c, name, len);
            if (!o) return unknown(c, a);
            char *opt = pln_xasprintf("--%.*s", (int)len, name);
            const char *val = NULL;
            if (!takes_value(o)) {
                if (eq) {
                    pln_opt_usage_error(c, "%s takes no value (given \"%s\")", opt, eq + 1);
                    free(opt);
                    return -1;
                }
            } else if (eq) {
                val = eq + 1;
            } else if (i + 1 < argc) {
                val = argv[++i];
            } else {
                if (c->rank == 0) fprintf(err_of(c), "pollen %s: --%s needs a value\n", c->cmd, o->name);
                free(opt);
                return -1;
            }
            pln_opt *p = pos_of(c, o);
            if (p && (p->given || (o->given && strcmp(*(const char **)o->dst, val)))) {
                pln_opt_usage_error(c, "%s given twice (%s and %s)", p->name, *(const char **)o->dst, val);
                free(opt);
                return -1;
            }
            int rc = apply(c, o, opt, val, NULL);
            free(opt);
            if (rc) return -1;
            continue;
        }
        /* short options: -x VALUE, -xVALUE, clustered flags -qj */
        for (const char *s = a + 1; *s; s++) {
            pln_opt *o = find_short(c, *s);
            if (!o && *s == 'h') {   /* -qh */
                if (c->rank == 0) pln_opt_help(c, out_of(c));
                return PLN_OPT_HELP;
            }
            if (!o) {
                char u[3] = {'-', *s, 0};
                return unknown(c, u);
            }
            char opt[3] = {'-', *s, 0};
            if (!takes_value(o)) {
                if (apply(c, o, opt, NULL, NULL)) return -1;
                continue;
            }
            const char *val = NULL;
            if (s[1]) val = s + 1;
            else if (i + 1 < argc) val = argv[++i];
            else {
                if (c->rank == 0) fprintf(err_of(c), "pollen %s: --%s needs a value\n", c->cmd, o->name);
                return -1;
            }
            pln_opt *p = pos_of(c, o);
            if (p && (p->given || (o->given && strcmp(*(const char **)o->dst, val)))) {
                pln_opt_usage_error(c, "%s given twice (%s and %s)", p->name, *(const char **)o->dst, val);
                return -1;
            }
            if (apply(c, o, opt, val, NULL)) return -1;
            break;
        }
    }
    if (from_env(c)) return -1;
    for (pln_opt *o = c->opts; o->name; o++) {
        if (!(o->flags & PLN_OPT_REQUIRED) || o->given) continue;
        if (o->kind == PLN_OPT_POS) {
            /* an option that fills it counts (-m SET) */
            if (*(const char **)o->dst) continue;
            pln_opt_usage_error(c, "missing %s", o->name);
        } else {
            pln_opt_usage_error(c, "missing required option --%s", o->name);
        }
        return -1;
    }
    return 0;
}

void pln_opt_parse_or_exit(pln_opt_cmd *c, int argc, char **argv) {
    int rc = pln_opt_parse(c, argc, argv);
    if (rc == 0) return;
    pln_opt_free(c);
    exit(rc == PLN_OPT_HELP ? 0 : 2);
}

void pln_opt_free(pln_opt_cmd *c) {
    for (pln_opt *o = c->opts; o->name; o++) {
        if (o->kind == PLN_OPT_LIST) {
            pln_opt_list *l = o->dst;
            free(l->v);
            l->v = NULL;
            l->n = 0;
        }
        free(o->def);
        o->def = NULL;
        free(o->env_name);
        o->env_name = NULL;
    }
}

/* ---- help ---------------------------------------------------------------------------------- */

/* "  -p, --prompt TEXT" or "  --json": the option column of one entry. */
static char *left_of(const pln_opt *o) {
    const char *mv = o->kind == PLN_OPT_FLAG ? NULL : o->metavar ? o->metavar : "VALUE";
    if (o->short_name)
        return pln_xasprintf("  -%c, --%s%s%s", o->short_name, o->name, mv ? " " : "", mv ? mv : "");
    return pln_xasprintf("  --%s%s%s", o->name, mv ? " " : "", mv ? mv : "");
}

/* The description with "{}" replaced by the default and the aliases named. */
static char *desc_of(const pln_opt *o) {
    const char *h = o->help ? o->help : "";
    const char *ph = strstr(h, "{}");
    char *d = ph ? pln_xasprintf("%.*s%s%s", (int)(ph - h), h, o->def ? o->def : "", ph + 2) : pln_xstrdup(h);
    if (o->aliases) {
        char *al = pln_xstrdup(o->aliases), *save = NULL;
        char *list = pln_xstrdup("");
        for (char *t = strtok_r(al, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            char *n = pln_xasprintf("%s%s--%s", list, *list ? ", " : "", t);
            free(list);
            list = n;
        }
        char *n = pln_xasprintf("%s%s(also %s)", d, *d ? " " : "", list);
        free(d);
        free(list);
        free(al);
        d = n;
    }
    return d;
}

/* Prints `text` from column `at` (the cursor is already there), wrapping at HELP_WIDTH onto lines
 * indented to `col`; embedded newlines start a new indented line. */
static void wrap(FILE *f, const char *text, int at, int col) {
    int x = at;
    const char *p = text;
    bool first = true;
    while (*p) {
        if (*p == '\n') {
            fprintf(f, "\n%*s", col, "");
            x = col;
            first = true;
            p++;
            continue;
        }
        const char *w = p;
        while (*w && *w != ' ' && *w != '\n') w++;
        int len = (int)(w - p);
        if (!first && x + 1 + len > HELP_WIDTH) {
            fprintf(f, "\n%*s", col, "");
            x = col;
            first = true;
        }
        if (!first) { fputc(' ', f); x++; }
        fprintf(f, "%.*s", len, p);
        x += len;
        first = false;
        p = w;
        while (*p == ' ') p++;
    }
    fputc('\n', f);
}

void pln_opt_help(pln_opt_cmd *c, FILE *f) {
    bool prepared = false;
    for (pln_opt *o = c->opts; o->name; o++) if (o->def) prepared = true;
    if (!prepared) prepare(c);
    /* synopsis: "usage: " then each line under the first */
    const char *s = c->synopsis;
    for (bool first = true; s && *s; first = false) {
        const char *e = strchr(s, '\n');
        int n = e ? (int)(e - s) : (int)strlen(s);
        fprintf(f, "%s%.*s\n", first ? "usage: " : "       ", n, s);
        s = e ? e + 1 : s + n;
    }
    if (c->intro) fputs(c->intro, f);
    int col = 0;
    for (pln_opt *o = c->opts; o->name; o++) {
        if (o->flags & PLN_OPT_HIDDEN || o->kind == PLN_OPT_POS) continue;
        char *l = left_of(o);
        int w = (int)strlen(l) + 2;
        if (w <= HELP_MAX_COL && w > col) col = w;
        free(l);
    }
    for (pln_opt *o = c->opts; o->name; o++) {
        if (o->flags & PLN_OPT_HIDDEN || o->kind == PLN_OPT_POS) continue;
        char *l = left_of(o), *d = desc_of(o);
        int w = (int)strlen(l);
        fputs(l, f);
        int at = w + 2 <= col ? col : w + 2;
        fprintf(f, "%*s", at - w, "");
        wrap(f, d, at, col);
        free(l);
        free(d);
    }
    fprintf(f, "  -h, --help%*sthis help\n", col > 12 ? col - 12 : 2, "");
    bool any_env = false;
    for (pln_opt *o = c->opts; o->name; o++) if (o->env_name) any_env = true;
    if (any_env) {
        fprintf(f, "\nenvironment: every option above can be set by a variable; the command line wins over it,\n"
                   "it over the default; a bad value is an error naming the variable:\n");
        int x = 0;
        for (pln_opt *o = c->opts; o->name; o++) {
            if (!o->env_name) continue;
            int len = (int)strlen(o->env_name);
            if (x && x + 1 + len > HELP_WIDTH) { fputc('\n', f); x = 0; }
            if (!x) { fputs(" ", f); x = 1; }
            fprintf(f, " %s", o->env_name);
            x += len + 1;
        }
        fputc('\n', f);
    }
    if (c->epilog) fputs(c->epilog, f);
}
