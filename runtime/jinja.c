/* jinja.c — the Jinja engine behind chat templates (see jinja.h and docs/JINJA.md).
 *
 * Three stages, each as jinja2 does it: a lexer that applies the whitespace rules (trim_blocks,
 * lstrip_blocks, the -/+ markers) while it cuts the source into data and tag tokens; a
 * recursive-descent parser with jinja2's precedence; a tree-walking renderer whose values follow
 * Python's semantics (str of a float, truthiness, == across int/float/bool, dict order).
 *
 * Memory: the tree lives in the template's arena; every value made while rendering lives in a
 * per-render arena counted against max_memory, so a runtime error can unwind with longjmp and
 * free everything at once. */
#include "runtime/jinja.h"
#include "formats/common.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- arena ------------------------------------------------------------------------------- */
typedef struct ablock { struct ablock *next; size_t used, cap; char data[]; } ablock;
typedef struct { ablock *head; size_t total, limit; bool over; } arena;

static void *arena_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->limit && a->total + cap > a->limit) { a->over = true; return NULL; }
        ablock *b = malloc(sizeof *b + cap);
        if (!b) { a->over = true; return NULL; }
        b->next = a->head; b->used = 0; b->cap = cap; a->head = b; a->total += cap;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}
static void arena_free(arena *a) {
    for (ablock *b = a->head, *nx; b; b = nx) { nx = b->next; free(b); }
    a->head = NULL; a->total = 0;
}

/* ---- values ------------------------------------------------------------------------------ */
typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_MACRO,
               V_BUILTIN, V_METHOD, V_LOOP, V_CYCLER } vtype;
typedef struct jv jv;
typedef struct { jv **v; size_t n, cap; } jlist;
typedef struct { jv **k, **v; size_t n, cap; } jdict;
struct node;
struct loopst;
struct frame;
struct jv {
    uint8_t t;
    bool tuple;                     /* a V_LIST made by a tuple expression: repr uses () */
    bool unsafe;                    /* V_UNDEF from a sandbox refusal: any use is an error */
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *s; size_t n; } s;    /* V_STR; V_UNDEF: the message for misuse */
        jlist l;
        jdict d;                                  /* V_DICT, V_NS */
        struct { const struct node *node; struct frame *closure; } mc;   /* V_MACRO; closure: a caller's */
        int builtin;
        struct { jv *self; const char *name; } m;
        struct loopst *loop;
    };
};

/* ---- template tree ------------------------------------------------------------------------ */
typedef enum {
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_FILTERBLOCK, N_MACRO, N_CALLBLOCK, N_BREAK, N_CONTINUE, N_BLOCK,
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS, E_NOT,
    E_AND, E_OR, E_BIN, E_CMP, E_COND, E_LIST, E_TUPLE, E_DICT
} ntype;

typedef struct node node;
typedef struct { node **v; size_t n, cap; } nlist;
struct node {
    ntype t;
    int line;
    const char *s; size_t sn;    /* text, name, attribute, filter/test name, operator */
    jv *lit;
    node *a, *b, *c, *d;         /* operands / condition / iterable / filter */
    nlist args;                  /* call args, list items, if branches, bodies */
    nlist kwnames;               /* E_CALL/E_FILTER/E_TEST: kwargs as E_LIT name + value in kwvals */
    nlist kwvals;
    nlist body, orelse;
    nlist targets;               /* for/set targets (E_NAME or E_ATTR) */
    bool neg;                    /* E_TEST: is not */
};

struct pln_jinja {
    char *name;
    arena ar;
    nlist body;
};

const char *pln_jinja_name(const pln_jinja *t) { return t->name; }

void pln_jinja_limits_default(pln_jinja_limits *l) {
    l->max_steps = 1000000; l->max_output = 8u << 20; l->max_memory = 256u << 20;
    l->max_depth = 64; l->now = -1;
}

/* ======================================================================================== */
/* Lexer                                                                                    */
/* ======================================================================================== */
typedef enum { T_EOF, T_DATA, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT,
               T_OP } ttype;
typedef struct { ttype t; int line; const char *s; size_t n; int64_t i; double f; } token;

typedef struct {
    const char *name;
    arena *ar;
    token *tk; size_t ntk, cap;
    size_t pos;                  /* parser cursor */
    int depth;                   /* expression nesting, bounded so hostile input cannot exhaust the stack */
    jmp_buf jb;
    char err[400];
} pstate;

static void perr(pstate *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
static void perr(pstate *p, int line, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    char m[320]; vsnprintf(m, sizeof m, fmt, ap); va_end(ap);
    snprintf(p->err, sizeof p->err, "%s:%d: %s", p->name, line, m);
    longjmp(p->jb, 1);
}
static void *palloc(pstate *p, size_t n) {
    void *r = arena_alloc(p->ar, n);
    if (!r) perr(p, 0, "out of memory parsing the template");
    return r;
}
static void push_tok(pstate *p, token t) {
    if (p->ntk == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 256;
        token *nt = palloc(p, nc * sizeof *nt);
        if (p->ntk) memcpy(nt, p->tk, p->ntk * sizeof *nt);
        p->tk = nt; p->cap = nc;
    }
    p->tk[p->ntk++] = t;
}
static char *pstrndup(pstate *p, const char *s, size_t n) {
    char *r = palloc(p, n + 1); memcpy(r, s, n); r[n] = 0; return r;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int count_nl(const char *s, size_t n) { int k = 0; for (size_t i = 0; i < n; i++) k += s[i] == '\n'; return k; }

/* Python's unicode-escape decoding of a string literal's body, as jinja2's lexer does. */
static void put_utf8(char *o, size_t *k, uint32_t c) {
    if (c < 0x80) o[(*k)++] = (char)c;
    else if (c < 0x800) { o[(*k)++] = (char)(0xC0 | c >> 6); o[(*k)++] = (char)(0x80 | (c & 63)); }
    else if (c < 0x10000) { o[(*k)++] = (char)(0xE0 | c >> 12); o[(*k)++] = (char)(0x80 | (c >> 6 & 63)); o[(*k)++] = (char)(0x80 | (c & 63)); }
    else { o[(*k)++] = (char)(0xF0 | c >> 18); o[(*k)++] = (char)(0x80 | (c >> 12 & 63)); o[(*k)++] = (char)(0x80 | (c >> 6 & 63)); o[(*k)++] = (char)(0x80 | (c & 63)); }
}
static int hexv(char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; }

static const char *unescape(pstate *p, const char *s, size_t n, size_t *on, int line) {
    char *o = palloc(p, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) { o[k++] = s[i]; continue; }
        char c = s[++i];
        int hl = 0;
        switch (c) {
        case 'n': o[k++] = '\n'; break;  case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;  case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break; case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;  case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;  case 'v': o[k++] = '\v'; break;
        case '\n': break;
        case 'x': hl = 2; break; case 'u': hl = 4; break; case 'U': hl = 8; break;
        default:
            if (c >= '0' && c <= '7') {
                uint32_t v = 0; int d = 0;
                while (d < 3 && i < n && s[i] >= '0' && s[i] <= '7') { v = v * 8 + (uint32_t)(s[i] - '0'); i++; d++; }
                i--; put_utf8(o, &k, v);
            } else { o[k++] = '\\'; o[k++] = c; }
        }
        if (hl) {
            uint32_t v = 0;
            for (int d = 0; d < hl; d++) {
                int h = i + 1 + (size_t)d < n ? hexv(s[i + 1 + d]) : -1;
                if (h < 0) perr(p, line, "truncated \\%c escape in a string literal", c);
                v = v * 16 + (uint32_t)h;
            }
            if (v > 0x10FFFF) perr(p, line, "illegal Unicode character in a string literal");
            i += (size_t)hl; put_utf8(o, &k, v);
        }
    }
    o[k] = 0; *on = k;
    return o;
}

/* Tokenizes an expression inside a tag from *pos until the closing marker at bracket depth 0.
 * Returns the position of the closing marker's first byte ("-" included). */
static size_t lex_expr(pstate *p, const char *src, size_t n, size_t pos, int *line, bool block) {
    int depth = 0;
    while (1) {
        while (pos < n && is_ws(src[pos])) { if (src[pos] == '\n') (*line)++; pos++; }
        if (pos >= n) perr(p, *line, "unexpected end of template: a %s tag is not closed", block ? "{% %}" : "{{ }}");
        const char *c = src + pos;
        size_t left = n - pos;
        if (depth == 0) {
            if (block && ((left >= 2 && c[0] == '%' && c[1] == '}') || (left >= 3 && (c[0] == '-' || c[0] == '+') && c[1] == '%' && c[2] == '}'))) return pos;
            if (!block && ((left >= 2 && c[0] == '}' && c[1] == '}') || (left >= 3 && c[0] == '-' && c[1] == '}' && c[2] == '}'))) return pos;
        }
        token t = {.line = *line};
        if (isalpha((unsigned char)*c) || *c == '_') {
            size_t e = pos; while (e < n && (isalnum((unsigned char)src[e]) || src[e] == '_')) e++;
            t.t = T_NAME; t.s = src + pos; t.n = e - pos; pos = e;
        } else if (isdigit((unsigned char)*c)) {
            size_t e = pos; bool fl = false;
            while (e < n && (isdigit((unsigned char)src[e]) || src[e] == '_')) e++;
            if (e + 1 < n && src[e] == '.' && isdigit((unsigned char)src[e + 1])) { fl = true; e++; while (e < n && (isdigit((unsigned char)src[e]) || src[e] == '_')) e++; }
            if (e < n && (src[e] == 'e' || src[e] == 'E')) {
                size_t f = e + 1; if (f < n && (src[f] == '+' || src[f] == '-')) f++;
                if (f < n && isdigit((unsigned char)src[f])) { fl = true; e = f; while (e < n && isdigit((unsigned char)src[e])) e++; }
            }
            char buf[64]; size_t k = 0;
            for (size_t i = pos; i < e && k < sizeof buf - 1; i++) if (src[i] != '_') buf[k++] = src[i];
            buf[k] = 0;
            if (fl) { t.t = T_FLOAT; t.f = strtod(buf, NULL); }
            else { t.t = T_INT; errno = 0; t.i = strtoll(buf, NULL, 10); if (errno) perr(p, *line, "integer literal %s is too large", buf); }
            pos = e;
        } else if (*c == '\'' || *c == '"') {
            size_t e = pos + 1;
            while (e < n && src[e] != *c) { if (src[e] == '\\') e++; e++; }
            if (e >= n) perr(p, *line, "unterminated string literal");
            t.t = T_STR;
            t.s = unescape(p, src + pos + 1, e - pos - 1, &t.n, *line);
            *line += count_nl(src + pos, e - pos);
            pos = e + 1;
        } else {
            static const char *ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "(", ")",
                                        "[", "]", "{", "}", ",", ".", ":", "|", "=", "<", ">", NULL};
            int k;
            for (k = 0; ops[k]; k++) { size_t l = strlen(ops[k]); if (left >= l && !memcmp(c, ops[k], l)) break; }
            if (!ops[k]) perr(p, *line, "unexpected character '%c' in an expression", *c);
            t.t = T_OP; t.s = ops[k]; t.n = strlen(ops[k]);
            if (*c == '(' || *c == '[' || *c == '{') depth++;
            if (*c == ')' || *c == ']' || *c == '}') { if (depth == 0) perr(p, *line, "unexpected '%c'", *c); depth--; }
            pos += t.n;
        }
        push_tok(p, t);
    }
}

static bool tag_word(const char *src, size_t n, size_t pos, const char *word, size_t *after) {
    /* after "{%" : optional -/+, spaces, word, spaces, optional -/+, "%}" */
    if (pos < n && (src[pos] == '-' || src[pos] == '+')) pos++;
    while (pos < n && is_ws(src[pos])) pos++;
    size_t l = strlen(word);
    if (pos + l > n || memcmp(src + pos, word, l)) return false;
    pos += l;
    if (pos < n && (isalnum((unsigned char)src[pos]) || src[pos] == '_')) return false;
    while (pos < n && is_ws(src[pos])) pos++;
    if (pos < n && (src[pos] == '-' || src[pos] == '+')) pos++;
    if (pos + 2 > n || src[pos] != '%' || src[pos + 1] != '}') return false;
    *after = pos;
    return true;
}

static void lex(pstate *p, const char *src, size_t n) {
    size_t pos = 0;
    int line = 1;
    bool strip_next = false;     /* the previous tag ended with '-': drop leading whitespace */
    while (pos <= n) {
        if (strip_next) { while (pos < n && is_ws(src[pos])) { if (src[pos] == '\n') line++; pos++; } strip_next = false; }
        size_t st = pos;
        while (st + 1 < n && !(src[st] == '{' && (src[st + 1] == '{' || src[st + 1] == '%' || src[st + 1] == '#'))) st++;
        if (st + 1 >= n) st = n;
        const char *text = src + pos;
        size_t tn = st - pos;
        int tline = line;
        line += count_nl(text, tn);
        if (st == n) { if (tn) push_tok(p, (token){.t = T_DATA, .line = tline, .s = text, .n = tn}); break; }
        char kind = src[st + 1];
        char sign = st + 2 < n ? src[st + 2] : 0;
        if (sign == '-') { while (tn && is_ws(text[tn - 1])) tn--; }
        else if (sign != '+' && kind != '{') {
            /* lstrip_blocks: spaces and tabs from the start of the line up to a block or comment tag */
            size_t l = tn; while (l && text[l - 1] != '\n') l--;
            bool line_start = l > 0 || pos == 0 || src[pos - 1] == '\n';
            if (line_start && l < tn) {
                bool allws = true;
                for (size_t i = l; i < tn; i++) if (!is_ws(text[i])) { allws = false; break; }
                if (allws) tn = l;
            }
        }
        if (tn) push_tok(p, (token){.t = T_DATA, .line = tline, .s = text, .n = tn});
        size_t q = st + 2 + (sign == '-' || sign == '+');
        if (kind == '#') {
            size_t e = q;
            while (e + 1 < n && !(src[e] == '#' && src[e + 1] == '}')) e++;
            if (e + 1 >= n) perr(p, line, "unterminated comment {# ... #}");
            line += count_nl(src + st, e - st);
            bool minus = e > q && src[e - 1] == '-', plus = e > q && src[e - 1] == '+';
            pos = e + 2;
            if (minus) strip_next = true;
            else if (!plus && pos < n && src[pos] == '\n') { pos++; line++; }
            continue;
        }
        size_t after;
        if (kind == '%' && tag_word(src, n, st + 2, "raw", &after)) {
            /* jinja2: no trim_blocks after {% raw %}; {% endraw %} strips like any block tag */
            size_t body = after + 2, after2 = 0, e;
            if (src[after - 1] == '-') while (body < n && is_ws(src[body])) body++;
            for (e = body;; e += 2) {
                while (e + 1 < n && !(src[e] == '{' && src[e + 1] == '%')) e++;
                if (e + 1 >= n) perr(p, line, "unterminated {%% raw %%} block: add {%% endraw %%}");
                if (tag_word(src, n, e + 2, "endraw", &after2)) break;
            }
            size_t rn = e - body;
            char es = src[e + 2];
            if (es == '-') while (rn && is_ws(src[body + rn - 1])) rn--;
            else if (es != '+') {
                size_t l = rn; while (l && src[body + l - 1] != '\n') l--;
                bool allws = l < rn;
                for (size_t i = l; i < rn; i++) if (!is_ws(src[body + i])) allws = false;
                if (allws && (l > 0 || src[body - 1] == '\n')) rn = l;
            }
            if (rn) push_tok(p, (token){.t = T_DATA, .line = line, .s = src + body, .n = rn});
            line += count_nl(src + st, after2 + 2 - st);
            pos = after2 + 2;
            if (src[after2 - 1] == '-') strip_next = true;
            else if (src[after2 - 1] != '+' && pos < n && src[pos] == '\n') { pos++; line++; }
            continue;
        }
        bool block = kind == '%';
        push_tok(p, (token){.t = block ? T_BBEGIN : T_VBEGIN, .line = line});
        size_t e = lex_expr(p, src, n, q, &line, block);
        push_tok(p, (token){.t = block ? T_BEND : T_VEND, .line = line});
        char m = src[e];
        pos = e + (m == '-' || m == '+' ? 3 : 2);
        if (m == '-') strip_next = true;
        else if (block && m != '+' && pos < n && src[pos] == '\n') { pos++; line++; }
    }
    push_tok(p, (token){.t = T_EOF, .line = line});
}

/* ======================================================================================== */
/* Parser                                                                                   */
/* ======================================================================================== */
static token *cur(pstate *p) { return &p->tk[p->pos]; }
static token *nexttok(pstate *p) { token *t = &p->tk[p->pos]; if (t->t != T_EOF) p->pos++; return t; }
static bool is_op(token *t, const char *op) { return t->t == T_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n); }
static bool is_name(token *t, const char *nm) { return t->t == T_NAME && t->n == strlen(nm) && !memcmp(t->s, nm, t->n); }
static const char *tokdesc(token *t, char *buf, size_t len) {
    switch (t->t) {
    case T_EOF: return "end of template";
    case T_DATA: return "template text";
    case T_VEND: return "'}}'";
    case T_BEND: return "'%}'";
    case T_VBEGIN: return "'{{'";
    case T_BBEGIN: return "'{%'";
    case T_STR: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    default: snprintf(buf, len, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
    }
}
static void expect_op(pstate *p, const char *op) {
    token *t = cur(p);
    if (!is_op(t, op)) { char b[64]; perr(p, t->line, "expected '%s', found %s", op, tokdesc(t, b, sizeof b)); }
    p->pos++;
}
static void nl_push(pstate *p, nlist *l, node *x) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        node **nv = palloc(p, nc * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv; l->cap = nc;
    }
    l->v[l->n++] = x;
}
static node *mk(pstate *p, ntype t, int line) { node *x = palloc(p, sizeof *x); x->t = t; x->line = line; return x; }
static jv *mklit(pstate *p) { return palloc(p, sizeof(jv)); }

static node *parse_expr(pstate *p);
static node *parse_or(pstate *p);
static node *parse_unary(pstate *p, bool with_filter);
static node *parse_tuple(pstate *p, bool simplified, bool allow_empty);

static void parse_call_args(pstate *p, node *x) {
    expect_op(p, "(");
    while (!is_op(cur(p), ")")) {
        if (x->args.n || x->kwnames.n) expect_op(p, ",");
        if (is_op(cur(p), ")")) break;
        token *t = cur(p);
        if (is_op(t, "*")) perr(p, t->line, "*args in a call is not supported by pollen's Jinja");
        if (t->t == T_NAME && is_op(&p->tk[p->pos + 1], "=")) {
            node *k = mk(p, E_LIT, t->line); k->s = pstrndup(p, t->s, t->n); k->sn = t->n;
            p->pos += 2;
            nl_push(p, &x->kwnames, k);
            nl_push(p, &x->kwvals, parse_expr(p));
        } else {
            if (x->kwnames.n) perr(p, t->line, "a positional argument follows a keyword argument");
            nl_push(p, &x->args, parse_expr(p));
        }
    }
    expect_op(p, ")");
}

static node *parse_primary(pstate *p) {
    token *t = nexttok(p);
    node *x;
    switch (t->t) {
    case T_NAME:
        x = mk(p, E_LIT, t->line);
        x->lit = mklit(p);
        if (is_name(t, "true") || is_name(t, "True")) { x->lit->t = V_BOOL; x->lit->b = true; }
        else if (is_name(t, "false") || is_name(t, "False")) { x->lit->t = V_BOOL; x->lit->b = false; }
        else if (is_name(t, "none") || is_name(t, "None")) x->lit->t = V_NONE;
        else { x->t = E_NAME; x->s = pstrndup(p, t->s, t->n); x->sn = t->n; x->lit = NULL; }
        return x;
    case T_STR: {
        /* adjacent string literals concatenate */
        size_t total = t->n; size_t k = p->pos;
        while (p->tk[k].t == T_STR) total += p->tk[k++].n;
        char *s = palloc(p, total + 1); size_t o = 0;
        memcpy(s, t->s, t->n); o = t->n;
        while (cur(p)->t == T_STR) { token *u = nexttok(p); memcpy(s + o, u->s, u->n); o += u->n; }
        x = mk(p, E_LIT, t->line); x->lit = mklit(p); x->lit->t = V_STR; x->lit->s.s = s; x->lit->s.n = o;
        return x;
    }
    case T_INT: x = mk(p, E_LIT, t->line); x->lit = mklit(p); x->lit->t = V_INT; x->lit->i = t->i; return x;
    case T_FLOAT: x = mk(p, E_LIT, t->line); x->lit = mklit(p); x->lit->t = V_FLOAT; x->lit->f = t->f; return x;
    case T_OP:
        if (is_op(t, "(")) {
            x = parse_tuple(p, false, true);
            expect_op(p, ")");
            return x;
        }
        if (is_op(t, "[")) {
            x = mk(p, E_LIST, t->line);
            while (!is_op(cur(p), "]")) {
                if (x->args.n) expect_op(p, ",");
                if (is_op(cur(p), "]")) break;
                nl_push(p, &x->args, parse_expr(p));
            }
            expect_op(p, "]");
            return x;
        }
        if (is_op(t, "{")) {
            x = mk(p, E_DICT, t->line);
            while (!is_op(cur(p), "}")) {
                if (x->args.n) expect_op(p, ",");
                if (is_op(cur(p), "}")) break;
                nl_push(p, &x->args, parse_expr(p));
                expect_op(p, ":");
                nl_push(p, &x->kwvals, parse_expr(p));
            }
            expect_op(p, "}");
            return x;
        }
        /* fallthrough */
    default: {
        char b[64];
        perr(p, t->line, "unexpected %s in an expression", tokdesc(t, b, sizeof b));
    }
    }
}

static node *parse_postfix(pstate *p, node *x) {
    while (1) {
        token *t = cur(p);
        if (is_op(t, ".")) {
            p->pos++;
            token *a = nexttok(p);
            if (a->t == T_INT) {   /* foo.0 is foo[0] */
                node *y = mk(p, E_ITEM, a->line); y->a = x; y->b = mk(p, E_LIT, a->line);
                y->b->lit = mklit(p); y->b->lit->t = V_INT; y->b->lit->i = a->i; x = y; continue;
            }
            if (a->t != T_NAME) perr(p, a->line, "expected an attribute name after '.'");
            node *y = mk(p, E_ATTR, a->line); y->a = x; y->s = pstrndup(p, a->s, a->n); y->sn = a->n; x = y;
        } else if (is_op(t, "[")) {
            p->pos++;
            node *parts[3] = {0}; int np = 0; bool slice = false;
            while (1) {
                if (is_op(cur(p), ":")) { slice = true; p->pos++; if (np < 2) np++; else perr(p, t->line, "too many ':' in a slice"); continue; }
                if (is_op(cur(p), "]")) break;
                if (parts[np]) perr(p, t->line, "expected ':' or ']' in a subscript");
                parts[np] = parse_expr(p);
            }
            p->pos++;
            if (slice) { node *y = mk(p, E_SLICE, t->line); y->a = x; y->b = parts[0]; y->c = parts[1]; y->d = parts[2]; x = y; }
            else {
                if (!parts[0]) perr(p, t->line, "empty subscript []");
                node *y = mk(p, E_ITEM, t->line); y->a = x; y->b = parts[0]; x = y;
            }
        } else if (is_op(t, "(")) {
            node *y = mk(p, E_CALL, t->line); y->a = x; parse_call_args(p, y); x = y;
        } else return x;
    }
}

static node *parse_filter(pstate *p, node *x) {
    token *t = nexttok(p);
    if (t->t != T_NAME) perr(p, t->line, "expected a filter name after '|'");
    node *f = mk(p, E_FILTER, t->line);
    f->a = x; f->s = pstrndup(p, t->s, t->n); f->sn = t->n;
    if (is_op(cur(p), "(")) parse_call_args(p, f);
    return f;
}

static node *parse_test(pstate *p, node *x) {
    token *t = nexttok(p);   /* 'is' */
    node *f = mk(p, E_TEST, t->line);
    f->a = x;
    if (is_name(cur(p), "not")) { f->neg = true; p->pos++; }
    token *n = nexttok(p);
    if (n->t != T_NAME && !(n->t == T_OP && (is_op(n, "==") || is_op(n, "!=") || is_op(n, "<") || is_op(n, ">") || is_op(n, "<=") || is_op(n, ">="))))
        perr(p, n->line, "expected a test name after 'is'");
    f->s = pstrndup(p, n->s, n->n); f->sn = n->n;
    token *c = cur(p);
    if (is_op(c, "(")) parse_call_args(p, f);
    else if ((c->t == T_NAME || c->t == T_STR || c->t == T_INT || c->t == T_FLOAT || is_op(c, "[") || is_op(c, "{")) &&
             !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and") && !is_name(c, "if") && !is_name(c, "in") && !is_name(c, "is") && !is_name(c, "not")) {
        node *arg = parse_postfix(p, parse_primary(p));
        nl_push(p, &f->args, arg);
    }
    return f;
}

static node *parse_filter_expr(pstate *p, node *x) {
    while (1) {
        token *t = cur(p);
        if (is_op(t, "|")) { p->pos++; x = parse_filter(p, x); }
        else if (is_name(t, "is")) x = parse_test(p, x);
        else if (is_op(t, "(")) { node *y = mk(p, E_CALL, t->line); y->a = x; parse_call_args(p, y); x = y; }
        else return x;
    }
}

static node *parse_unary(pstate *p, bool with_filter) {
    token *t = cur(p);
    if (++p->depth > 200) perr(p, t->line, "expression nested too deeply (over 200 levels)");
    node *x;
    if (is_op(t, "-")) { p->pos++; x = mk(p, E_NEG, t->line); x->a = parse_unary(p, false); }
    else if (is_op(t, "+")) { p->pos++; x = mk(p, E_POS, t->line); x->a = parse_unary(p, false); }
    else x = parse_primary(p);
    x = parse_postfix(p, x);
    if (with_filter) x = parse_filter_expr(p, x);
    p->depth--;
    return x;
}

static node *binop(pstate *p, const char *op, node *a, node *b, int line) {
    node *x = mk(p, E_BIN, line); x->s = op; x->a = a; x->b = b; return x;
}
static node *parse_pow(pstate *p) {
    node *x = parse_unary(p, true);
    while (is_op(cur(p), "**")) { int l = nexttok(p)->line; x = binop(p, "**", x, parse_unary(p, true), l); }
    return x;
}
static node *parse_math2(pstate *p) {
    node *x = parse_pow(p);
    while (1) {
        token *t = cur(p);
        if (is_op(t, "*") || is_op(t, "/") || is_op(t, "//") || is_op(t, "%")) { p->pos++; x = binop(p, t->s, x, parse_pow(p), t->line); }
        else return x;
    }
}
static node *parse_concat(pstate *p) {
    node *x = parse_math2(p);
    while (is_op(cur(p), "~")) { int l = nexttok(p)->line; x = binop(p, "~", x, parse_math2(p), l); }
    return x;
}
static node *parse_math1(pstate *p) {
    node *x = parse_concat(p);
    while (1) {
        token *t = cur(p);
        if (is_op(t, "+") || is_op(t, "-")) { p->pos++; x = binop(p, t->s, x, parse_concat(p), t->line); }
        else return x;
    }
}
static node *parse_compare(pstate *p) {
    node *first = parse_math1(p);
    node *x = NULL;
    while (1) {
        token *t = cur(p);
        const char *op = NULL;
        if (is_op(t, "==") || is_op(t, "!=") || is_op(t, "<") || is_op(t, ">") || is_op(t, "<=") || is_op(t, ">=")) { op = t->s; p->pos++; }
        else if (is_name(t, "in")) { op = "in"; p->pos++; }
        else if (is_name(t, "not") && is_name(&p->tk[p->pos + 1], "in")) { op = "notin"; p->pos += 2; }
        else break;
        if (!x) { x = mk(p, E_CMP, t->line); nl_push(p, &x->args, first); }
        node *o = mk(p, E_LIT, t->line); o->s = op;
        nl_push(p, &x->kwnames, o);
        nl_push(p, &x->args, parse_math1(p));
    }
    return x ? x : first;
}
static node *parse_not(pstate *p) {
    if (is_name(cur(p), "not")) { int l = nexttok(p)->line; node *x = mk(p, E_NOT, l); x->a = parse_not(p); return x; }
    return parse_compare(p);
}
static node *parse_and(pstate *p) {
    node *x = parse_not(p);
    while (is_name(cur(p), "and")) { int l = nexttok(p)->line; node *y = mk(p, E_AND, l); y->a = x; y->b = parse_not(p); x = y; }
    return x;
}
static node *parse_or(pstate *p) {
    node *x = parse_and(p);
    while (is_name(cur(p), "or")) { int l = nexttok(p)->line; node *y = mk(p, E_OR, l); y->a = x; y->b = parse_and(p); x = y; }
    return x;
}
static node *parse_condexpr(pstate *p, bool with_cond) {
    node *x = parse_or(p);
    while (with_cond && is_name(cur(p), "if")) {
        int l = nexttok(p)->line;
        node *y = mk(p, E_COND, l);
        y->a = x; y->b = parse_or(p);
        if (is_name(cur(p), "else")) { p->pos++; y->c = parse_condexpr(p, true); }
        x = y;
    }
    return x;
}
static node *parse_expr(pstate *p) {
    if (++p->depth > 200) perr(p, cur(p)->line, "expression nested too deeply (over 200 levels)");
    node *x = parse_condexpr(p, true);
    p->depth--;
    return x;
}

/* a, b, c  → E_TUPLE; a single expression without a comma stays itself. */
static node *parse_tuple(pstate *p, bool simplified, bool allow_empty) {
    int line = cur(p)->line;
    node *t = mk(p, E_TUPLE, line);
    bool comma = false;
    while (1) {
        token *c = cur(p);
        if (t->args.n) { if (!is_op(c, ",")) break; p->pos++; comma = true; c = cur(p); }
        if (c->t == T_VEND || c->t == T_BEND || is_op(c, ")") || is_name(c, "in") || is_op(c, "=")) break;
        nl_push(p, &t->args, simplified ? parse_primary(p) : parse_expr(p));
    }
    if (!t->args.n && !allow_empty) perr(p, line, "expected an expression");
    if (t->args.n == 1 && !comma) return t->args.v[0];
    return t;
}

static node *parse_assign_target(pstate *p, nlist *out) {
    while (1) {
        token *t = nexttok(p);
        if (t->t != T_NAME) perr(p, t->line, "expected a variable name to assign to");
        node *x = mk(p, E_NAME, t->line); x->s = pstrndup(p, t->s, t->n); x->sn = t->n;
        if (is_op(cur(p), ".")) {
            p->pos++;
            token *a = nexttok(p);
            if (a->t != T_NAME) perr(p, a->line, "expected an attribute name after '.'");
            node *y = mk(p, E_ATTR, a->line); y->a = x; y->s = pstrndup(p, a->s, a->n); y->sn = a->n; x = y;
        }
        nl_push(p, out, x);
        if (!is_op(cur(p), ",")) break;
        p->pos++;
    }
    return out->v[0];
}

static void expect_bend(pstate *p) {
    token *t = cur(p);
    if (t->t != T_BEND) { char b[64]; perr(p, t->line, "expected '%%}', found %s", tokdesc(t, b, sizeof b)); }
    p->pos++;
}

/* Parses template body until a block tag whose name is in ends (NULL-terminated); returns the
 * index of the end name found (the cursor is after that name), or -1 at EOF when ends is NULL. */
static int parse_body(pstate *p, nlist *body, const char *const *ends, const char *what, int open_line);

/* "(" name ("=" default)? ,... ")" of a macro or call block, into x->args */
static void parse_params(pstate *p, node *x) {
    expect_op(p, "(");
    while (!is_op(cur(p), ")")) {
        if (x->args.n) expect_op(p, ",");
        if (is_op(cur(p), ")")) break;
        token *a = nexttok(p);
        if (a->t != T_NAME) perr(p, a->line, "expected a parameter name");
        node *pa = mk(p, E_NAME, a->line); pa->s = pstrndup(p, a->s, a->n); pa->sn = a->n;
        if (is_op(cur(p), "=")) { p->pos++; pa->a = parse_expr(p); }
        nl_push(p, &x->args, pa);
    }
    expect_op(p, ")");
}

static node *parse_stmt(pstate *p, token *kw) {
    int line = kw->line;
    if (is_name(kw, "if")) {
        node *x = mk(p, N_IF, line);
        node *br = mk(p, N_BLOCK, line);
        br->a = parse_expr(p); expect_bend(p);
        nl_push(p, &x->args, br);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        while (1) {
            int e = parse_body(p, &br->body, ends, "if", line);
            if (e == 0) { br = mk(p, N_BLOCK, cur(p)->line); br->a = parse_expr(p); expect_bend(p); nl_push(p, &x->args, br); continue; }
            if (e == 1) { expect_bend(p); static const char *const e2[] = {"endif", NULL}; parse_body(p, &x->orelse, e2, "if", line); }
            expect_bend(p);
            return x;
        }
    }
    if (is_name(kw, "for")) {
        node *x = mk(p, N_FOR, line);
        parse_assign_target(p, &x->targets);
        for (size_t i = 0; i < x->targets.n; i++) if (x->targets.v[i]->t != E_NAME) perr(p, line, "a for loop target must be a plain name");
        if (!is_name(cur(p), "in")) perr(p, line, "expected 'in' in a for loop");
        p->pos++;
        x->a = parse_tuple(p, false, false);   /* parse_expr without the conditional 'if' */
        if (x->a->t == E_COND) {   /* "for x in xs if cond": jinja2 reads the if as the loop filter */
            node *c = x->a; x->a = c->a; x->b = c->b;
            if (c->c) perr(p, line, "a for loop's filter 'if' takes no 'else'");
        }
        if (is_name(cur(p), "if")) { p->pos++; x->b = parse_expr(p); }
        if (is_name(cur(p), "recursive")) perr(p, line, "recursive for loops are not supported by pollen's Jinja");
        expect_bend(p);
        static const char *const ends[] = {"else", "endfor", NULL};
        int e = parse_body(p, &x->body, ends, "for", line);
        if (e == 0) { expect_bend(p); static const char *const e2[] = {"endfor", NULL}; parse_body(p, &x->orelse, e2, "for", line); }
        expect_bend(p);
        return x;
    }
    if (is_name(kw, "set")) {
        nlist tg = {0};
        parse_assign_target(p, &tg);
        if (is_op(cur(p), "=")) {
            p->pos++;
            node *x = mk(p, N_SET, line);
            x->targets = tg;
            x->a = parse_tuple(p, false, false);
            expect_bend(p);
            return x;
        }
        if (tg.n != 1 || tg.v[0]->t != E_NAME) perr(p, line, "a {%% set %%} block assigns one plain name");
        node *x = mk(p, N_SETBLOCK, line);
        x->targets = tg;
        while (is_op(cur(p), "|")) { p->pos++; node *f = parse_filter(p, NULL); nl_push(p, &x->args, f); }
        expect_bend(p);
        static const char *const ends[] = {"endset", NULL};
        parse_body(p, &x->body, ends, "set", line);
        expect_bend(p);
        return x;
    }
    if (is_name(kw, "macro")) {
        token *n = nexttok(p);
        if (n->t != T_NAME) perr(p, line, "expected a macro name");
        node *x = mk(p, N_MACRO, line);
        x->s = pstrndup(p, n->s, n->n); x->sn = n->n;
        parse_params(p, x);
        expect_bend(p);
        static const char *const ends[] = {"endmacro", NULL};
        parse_body(p, &x->body, ends, "macro", line);
        if (cur(p)->t == T_NAME) p->pos++;   /* {% endmacro name %} */
        expect_bend(p);
        return x;
    }
    if (is_name(kw, "filter")) {   /* {% filter f(args) | g %}body{% endfilter %}: the body's output, filtered */
        node *x = mk(p, N_FILTERBLOCK, line);
        do { nl_push(p, &x->args, parse_filter(p, NULL)); } while (is_op(cur(p), "|") && (p->pos++, true));
        expect_bend(p);
        static const char *const ends[] = {"endfilter", NULL};
        parse_body(p, &x->body, ends, "filter", line);
        expect_bend(p);
        return x;
    }
    if (is_name(kw, "call")) {   /* {% call(params) macro(args) %}body{% endcall %}: body is the macro's caller() */
        node *x = mk(p, N_CALLBLOCK, line);
        x->s = "caller"; x->sn = 6;
        if (is_op(cur(p), "(")) parse_params(p, x);
        x->a = parse_expr(p);
        if (x->a->t != E_CALL) perr(p, line, "{%% call %%} expects a macro call");
        expect_bend(p);
        static const char *const ends[] = {"endcall", NULL};
        parse_body(p, &x->body, ends, "call", line);
        expect_bend(p);
        return x;
    }
    if (is_name(kw, "break") || is_name(kw, "continue")) {
        node *x = mk(p, is_name(kw, "break") ? N_BREAK : N_CONTINUE, line);
        expect_bend(p);
        return x;
    }
    if (is_name(kw, "generation")) {   /* transformers' AssistantTracker: renders its body */
        node *x = mk(p, N_BLOCK, line);
        expect_bend(p);
        static const char *const ends[] = {"endgeneration", NULL};
        parse_body(p, &x->body, ends, "generation", line);
        expect_bend(p);
        return x;
    }
    perr(p, line, "the {%% %.*s %%} tag is not supported by pollen's Jinja (docs/JINJA.md lists what is)", (int)kw->n, kw->s);
}

static int parse_body(pstate *p, nlist *body, const char *const *ends, const char *what, int open_line) {
    while (1) {
        token *t = nexttok(p);
        if (t->t == T_EOF) {
            if (!ends) return -1;
            { int k = 0; while (ends[k + 1]) k++;
              perr(p, open_line, "the {%% %s %%} block opened here is never closed (expected {%% %s %%})", what, ends[k]); }
        }
        if (t->t == T_DATA) { node *x = mk(p, N_TEXT, t->line); x->s = t->s; x->sn = t->n; nl_push(p, body, x); continue; }
        if (t->t == T_VBEGIN) {
            node *x = mk(p, N_OUT, t->line);
            x->a = parse_tuple(p, false, false);
            token *e = cur(p);
            if (e->t != T_VEND) { char b[64]; perr(p, e->line, "expected '}}', found %s", tokdesc(e, b, sizeof b)); }
            p->pos++;
            nl_push(p, body, x);
            continue;
        }
        if (t->t == T_BBEGIN) {
            token *kw = nexttok(p);
            if (kw->t != T_NAME) perr(p, kw->line, "expected a tag name after '{%%'");
            if (ends) for (int i = 0; ends[i]; i++) if (is_name(kw, ends[i])) return i;
            static const char *const stray[] = {"elif", "else", "endif", "endfor", "endset", "endmacro", "endcall", "endfilter", "endgeneration", NULL};
            for (int i = 0; stray[i]; i++)
                if (is_name(kw, stray[i])) perr(p, kw->line, "unexpected {%% %s %%}%s%s", stray[i], ends ? " inside a " : "", ends ? what : "");
            nl_push(p, body, parse_stmt(p, kw));
            continue;
        }
        char b[64];
        perr(p, t->line, "unexpected %s", tokdesc(t, b, sizeof b));
    }
}

pln_jinja *pln_jinja_parse(const char *src, size_t len, const char *name) {
    pln_jinja *t = pln_xcalloc(1, sizeof *t);
    t->name = pln_xstrdup(name ? name : "template");
    /* jinja2 normalizes newlines to \n and drops one trailing newline (keep_trailing_newline=False) */
    char *s = arena_alloc(&t->ar, len + 1);
    size_t n = 0;
    if (!s) { pln_errorf("%s: template too large", t->name); pln_jinja_free(t); return NULL; }
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') { s[n++] = '\n'; if (i + 1 < len && src[i + 1] == '\n') i++; }
        else s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    pstate *p = calloc(1, sizeof *p);
    if (!p) pln_die("out of memory");
    p->name = t->name; p->ar = &t->ar;
    if (setjmp(p->jb)) {
        pln_errorf("%s", p->err);
        free(p); pln_jinja_free(t);
        return NULL;
    }
    lex(p, s, n);
    parse_body(p, &t->body, NULL, "", 1);
    free(p);
    return t;
}

void pln_jinja_free(pln_jinja *t) {
    if (!t) return;
    arena_free(&t->ar);
    free(t->name);
    free(t);
}

/* ======================================================================================== */
/* Renderer                                                                                 */
/* ======================================================================================== */
typedef struct frame { struct frame *parent; jdict vars; } frame;
typedef struct { char *p; size_t n, cap; bool in_arena; } obuf;   /* in_arena: a capture (macro, set block) */

typedef struct {
    const pln_jinja *t;
    pln_jinja_limits lim;
    arena ar;
    obuf *out;
    uint64_t steps;
    int depth;
    int ctl;                     /* 1 break, 2 continue */
    frame *root;
    jmp_buf jb;
    pln_jinja_status status;
    char err[512];
} rctx;

typedef struct loopst {
    jlist items;
    size_t idx;
    jv *cycle_self;
} loopst;

static jv V_NONE_C = {.t = V_NONE}, V_TRUE_C = {.t = V_BOOL, .b = true},
          V_FALSE_C = {.t = V_BOOL, .b = false};

static void rfail(rctx *c, int line, pln_jinja_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5), noreturn));
static void rfail(rctx *c, int line, pln_jinja_status st, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    char m[420]; vsnprintf(m, sizeof m, fmt, ap); va_end(ap);
    if (st == PLN_JINJA_RAISED) snprintf(c->err, sizeof c->err, "%s", m);
    else snprintf(c->err, sizeof c->err, "%s:%d: %s", c->t->name, line, m);
    c->status = st;
    longjmp(c->jb, 1);
}
static void *ralloc(rctx *c, size_t n) {
    void *r = arena_alloc(&c->ar, n);
    if (!r) rfail(c, 0, PLN_JINJA_LIMIT, "the template used more than %zu bytes of memory (the sandbox's bound)", c->lim.max_memory);
    return r;
}
static jv *vnew(rctx *c, vtype t) { jv *v = ralloc(c, sizeof *v); v->t = (uint8_t)t; return v; }
static jv *vbool(bool b) { return b ? &V_TRUE_C : &V_FALSE_C; }
static jv *vint(rctx *c, int64_t i) { jv *v = vnew(c, V_INT); v->i = i; return v; }
static jv *vfloat(rctx *c, double f) { jv *v = vnew(c, V_FLOAT); v->f = f; return v; }
static jv *vstrn(rctx *c, const char *s, size_t n) {
    jv *v = vnew(c, V_STR); char *d = ralloc(c, n + 1); if (n) memcpy(d, s, n); d[n] = 0; v->s.s = d; v->s.n = n; return v;
}
static jv *vstr(rctx *c, const char *s) { return vstrn(c, s, strlen(s)); }
static jv *vundef(rctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static jv *vundef(rctx *c, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    char m[256]; vsnprintf(m, sizeof m, fmt, ap); va_end(ap);
    jv *v = vnew(c, V_UNDEF); v->s.s = vstr(c, m)->s.s; v->s.n = strlen(m);
    return v;
}
static void lpush(rctx *c, jlist *l, jv *x) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 8;
        jv **nv = ralloc(c, nc * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv; l->cap = nc;
    }
    l->v[l->n++] = x;
}
static jv *vlist(rctx *c) { return vnew(c, V_LIST); }
static bool streq(const jv *a, const char *s, size_t n) { return a->t == V_STR && a->s.n == n && !memcmp(a->s.s, s, n); }
static jv **dget(jdict *d, const char *k, size_t kn) {
    for (size_t i = 0; i < d->n; i++) if (streq(d->k[i], k, kn)) return &d->v[i];
    return NULL;
}
static bool veq(const jv *a, const jv *b);
static jv **dgetv(jdict *d, const jv *k) {
    for (size_t i = 0; i < d->n; i++) if (veq(d->k[i], k)) return &d->v[i];
    return NULL;
}
static void dsetv(rctx *c, jdict *d, jv *k, jv *v) {
    jv **s = dgetv(d, k);
    if (s) { *s = v; return; }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 8;
        jv **nk = ralloc(c, nc * sizeof *nk), **nv = ralloc(c, nc * sizeof *nv);
        if (d->n) { memcpy(nk, d->k, d->n * sizeof *nk); memcpy(nv, d->v, d->n * sizeof *nv); }
        d->k = nk; d->v = nv; d->cap = nc;
    }
    d->k[d->n] = k; d->v[d->n] = v; d->n++;
}
static void dset(rctx *c, jdict *d, const char *k, size_t kn, jv *v) {
    jv **s = dget(d, k, kn);
    if (s) { *s = v; return; }
    dsetv(c, d, vstrn(c, k, kn), v);
}

static jv *from_json(rctx *c, json_t *j) {
    switch (json_typeof(j)) {
    case JSON_NULL: return &V_NONE_C;
    case JSON_TRUE: return &V_TRUE_C;
    case JSON_FALSE: return &V_FALSE_C;
    case JSON_INTEGER: return vint(c, json_integer_value(j));
    case JSON_REAL: return vfloat(c, json_real_value(j));
    case JSON_STRING: return vstrn(c, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        jv *l = vlist(c); size_t i; json_t *e;
        json_array_foreach(j, i, e) lpush(c, &l->l, from_json(c, e));
        return l;
    }
    case JSON_OBJECT: {
        jv *d = vnew(c, V_DICT); const char *k; json_t *e;
        json_object_foreach(j, k, e) dsetv(c, &d->d, vstr(c, k), from_json(c, e));
        return d;
    }
    }
    return &V_NONE_C;
}

/* ---- strings as Python sees them ---------------------------------------------------------- */
typedef struct { char *p; size_t n, cap; } sbuf;
static void sb_put(rctx *c, sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = ralloc(c, nc);
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np; b->cap = nc;
    }
    memcpy(b->p + b->n, s, n); b->n += n; b->p[b->n] = 0;
}
static void sb_puts(rctx *c, sbuf *b, const char *s) { sb_put(c, b, s, strlen(s)); }
static jv *sb_val(rctx *c, sbuf *b) { jv *v = vnew(c, V_STR); v->s.s = b->p ? b->p : ""; v->s.n = b->n; return v; }

/* repr(float): the shortest string that reads back as the same double, in Python's layout. */
static void fmt_float(double f, char *out, size_t len) {
    if (isnan(f)) { snprintf(out, len, "nan"); return; }
    if (isinf(f)) { snprintf(out, len, f < 0 ? "-inf" : "inf"); return; }
    char buf[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) { snprintf(buf, sizeof buf, "%.*e", prec - 1, f); if (strtod(buf, NULL) == f) break; }
    /* buf: [-]d.ddde[+-]XX */
    char digits[32]; int nd = 0; bool neg = buf[0] == '-';
    const char *q = buf + neg;
    for (; *q && *q != 'e'; q++) if (isdigit((unsigned char)*q)) digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char *o = out; size_t left = len;
#define OUT(...) do { int w_ = snprintf(o, left, __VA_ARGS__); if (w_ > 0 && (size_t)w_ < left) { o += w_; left -= (size_t)w_; } } while (0)
    if (neg) OUT("-");
    if (exp >= -4 && exp < 16) {
        if (exp < 0) { OUT("0."); for (int i = 0; i < -exp - 1; i++) OUT("0"); OUT("%s", digits); }
        else {
            for (int i = 0; i <= exp; i++) OUT("%c", i < nd ? digits[i] : '0');
            OUT(".");
            if (nd > exp + 1) OUT("%s", digits + exp + 1); else OUT("0");
        }
    } else {
        OUT("%c", digits[0]);
        if (nd > 1) OUT(".%s", digits + 1);
        OUT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
#undef OUT
}

static void repr_into(rctx *c, sbuf *b, const jv *v);
static const char *type_name(const jv *v) {
    switch (v->t) {
    case V_UNDEF: return "Undefined"; case V_NONE: return "NoneType"; case V_BOOL: return "bool";
    case V_INT: return "int"; case V_FLOAT: return "float"; case V_STR: return "str";
    case V_LIST: return v->tuple ? "tuple" : "list"; case V_DICT: return "dict"; case V_NS: return "Namespace";
    case V_MACRO: return "Macro"; case V_BUILTIN: return "function"; case V_METHOD: return "builtin_function_or_method";
    case V_LOOP: return "LoopContext"; default: return "object";
    }
}
static void str_into(rctx *c, sbuf *b, const jv *v) {
    char tmp[64];
    switch (v->t) {
    case V_UNDEF: return;
    case V_NONE: sb_puts(c, b, "None"); return;
    case V_BOOL: sb_puts(c, b, v->b ? "True" : "False"); return;
    case V_INT: snprintf(tmp, sizeof tmp, "%" PRId64, v->i); sb_puts(c, b, tmp); return;
    case V_FLOAT: fmt_float(v->f, tmp, sizeof tmp); sb_puts(c, b, tmp); return;
    case V_STR: sb_put(c, b, v->s.s, v->s.n); return;
    case V_NS:   /* jinja2's Namespace.__repr__: f"<Namespace {attrs!r}>" */
        sb_puts(c, b, "<Namespace {");
        for (size_t i = 0; i < v->d.n; i++) { if (i) sb_puts(c, b, ", "); repr_into(c, b, v->d.k[i]); sb_puts(c, b, ": "); repr_into(c, b, v->d.v[i]); }
        sb_puts(c, b, "}>");
        return;
    case V_LIST: case V_DICT: repr_into(c, b, v); return;
    default: snprintf(tmp, sizeof tmp, "<%s object>", type_name(v)); sb_puts(c, b, tmp); return;
    }
}
static void repr_str(rctx *c, sbuf *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    sb_put(c, b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char tmp[12];
        if (ch == '\\') sb_puts(c, b, "\\\\");
        else if (ch == (unsigned char)q) { tmp[0] = '\\'; tmp[1] = q; sb_put(c, b, tmp, 2); }
        else if (ch == '\n') sb_puts(c, b, "\\n");
        else if (ch == '\r') sb_puts(c, b, "\\r");
        else if (ch == '\t') sb_puts(c, b, "\\t");
        else if (ch < 0x20 || ch == 0x7f) { snprintf(tmp, sizeof tmp, "\\x%02x", ch); sb_puts(c, b, tmp); }
        else if (ch == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] <= 0xA0) { snprintf(tmp, sizeof tmp, "\\x%02x", (unsigned char)s[i + 1]); sb_puts(c, b, tmp); i++; }
        else sb_put(c, b, s + i, 1);
    }
    sb_put(c, b, &q, 1);
}
static void repr_into(rctx *c, sbuf *b, const jv *v) {
    if (v->t == V_STR) { repr_str(c, b, v->s.s, v->s.n); return; }
    if (v->t == V_LIST) {
        sb_puts(c, b, v->tuple ? "(" : "[");
        for (size_t i = 0; i < v->l.n; i++) { if (i) sb_puts(c, b, ", "); repr_into(c, b, v->l.v[i]); }
        sb_puts(c, b, v->tuple ? (v->l.n == 1 ? ",)" : ")") : "]");
        return;
    }
    if (v->t == V_DICT) {
        sb_puts(c, b, "{");
        for (size_t i = 0; i < v->d.n; i++) { if (i) sb_puts(c, b, ", "); repr_into(c, b, v->d.k[i]); sb_puts(c, b, ": "); repr_into(c, b, v->d.v[i]); }
        sb_puts(c, b, "}");
        return;
    }
    str_into(c, b, v);
}
static jv *tostr(rctx *c, jv *v) {
    if (v->t == V_STR) return v;
    sbuf b = {0}; str_into(c, &b, v); return sb_val(c, &b);
}

/* ---- UTF-8 code points ------------------------------------------------------------------- */
static size_t u8len(const char *s, size_t n) { size_t k = 0; for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80; return k; }
/* byte offset of code point index ci (ci <= count) */
static size_t u8off(const char *s, size_t n, size_t ci) {
    size_t i = 0, k = 0;
    while (i < n) { if (((unsigned char)s[i] & 0xC0) != 0x80) { if (k == ci) return i; k++; } i++; }
    return n;
}
static uint32_t u8dec(const char *s, size_t n, size_t *adv) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) { *adv = 1; return u[0]; }
    if ((u[0] & 0xE0) == 0xC0) { *adv = 2; return (uint32_t)(u[0] & 31) << 6 | (u[1] & 63); }
    if ((u[0] & 0xF0) == 0xE0 && n >= 3) { *adv = 3; return (uint32_t)(u[0] & 15) << 12 | (uint32_t)(u[1] & 63) << 6 | (u[2] & 63); }
    if (n >= 4) { *adv = 4; return (uint32_t)(u[0] & 7) << 18 | (uint32_t)(u[1] & 63) << 12 | (uint32_t)(u[2] & 63) << 6 | (u[3] & 63); }
    *adv = 1; return u[0];
}
/* str.isspace() */
static bool py_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}
static size_t ws_prefix(const char *s, size_t n) {
    size_t i = 0, a;
    while (i < n && py_space(u8dec(s + i, n - i, &a))) i += a;
    return i;
}
static size_t ws_suffix_start(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        size_t a;
        if (!py_space(u8dec(s + st, end - st, &a))) break;
        end = st;
    }
    return end;
}

/* ---- Python semantics -------------------------------------------------------------------- */
static void undef_fail(rctx *c, int line, const jv *v) __attribute__((noreturn));
static void undef_fail(rctx *c, int line, const jv *v) {
    if (v->s.s) rfail(c, line, PLN_JINJA_ERROR, "%s", v->s.s);
    rfail(c, line, PLN_JINJA_ERROR, "a value is undefined");
}
static bool truthy(const jv *v) {
    switch (v->t) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v->b;
    case V_INT: return v->i != 0;
    case V_FLOAT: return v->f != 0;
    case V_STR: return v->s.n != 0;
    case V_LIST: return v->l.n != 0;
    case V_DICT: return v->d.n != 0;
    default: return true;
    }
}
static bool is_num(const jv *v) { return v->t == V_INT || v->t == V_FLOAT || v->t == V_BOOL; }
static double numf(const jv *v) { return v->t == V_FLOAT ? v->f : v->t == V_INT ? (double)v->i : v->b; }
static int64_t numi(const jv *v) { return v->t == V_INT ? v->i : v->b; }
static bool veq(const jv *a, const jv *b) {
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT) return numi(a) == numi(b);
        return numf(a) == numf(b);
    }
    if (a->t != b->t) return false;
    switch (a->t) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return a->s.n == b->s.n && !memcmp(a->s.s, b->s.s, a->s.n);
    case V_LIST:
        if (a->tuple != b->tuple || a->l.n != b->l.n) return false;
        for (size_t i = 0; i < a->l.n; i++) if (!veq(a->l.v[i], b->l.v[i])) return false;
        return true;
    case V_DICT: {
        if (a->d.n != b->d.n) return false;
        for (size_t i = 0; i < a->d.n; i++) {
            jv **o = dgetv((jdict *)&b->d, a->d.k[i]);
            if (!o || !veq(a->d.v[i], *o)) return false;
        }
        return true;
    }
    default: return a == b;
    }
}
/* -1/0/1, or a TypeError as Python raises for < between unorderable types */
static int vcmp(rctx *c, int line, const jv *a, const jv *b, const char *op) {
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT) return numi(a) < numi(b) ? -1 : numi(a) > numi(b);
        double x = numf(a), y = numf(b); return x < y ? -1 : x > y;
    }
    if (a->t == V_STR && b->t == V_STR) {
        size_t m = a->s.n < b->s.n ? a->s.n : b->s.n;
        int r = memcmp(a->s.s, b->s.s, m);
        return r ? (r < 0 ? -1 : 1) : (a->s.n < b->s.n ? -1 : a->s.n > b->s.n);
    }
    if (a->t == V_LIST && b->t == V_LIST) {
        for (size_t i = 0; i < a->l.n && i < b->l.n; i++) {
            if (veq(a->l.v[i], b->l.v[i])) continue;
            return vcmp(c, line, a->l.v[i], b->l.v[i], op);
        }
        return a->l.n < b->l.n ? -1 : a->l.n > b->l.n;
    }
    if (a->t == V_UNDEF) undef_fail(c, line, a);
    if (b->t == V_UNDEF) undef_fail(c, line, b);
    rfail(c, line, PLN_JINJA_ERROR, "'%s' not supported between instances of '%s' and '%s'", op, type_name(a), type_name(b));
}
static bool vin(rctx *c, int line, const jv *x, const jv *coll) {
    switch (coll->t) {
    case V_STR:
        if (x->t != V_STR) rfail(c, line, PLN_JINJA_ERROR, "'in <string>' requires string as left operand, not %s", type_name(x));
        if (!x->s.n) return true;
        return memmem(coll->s.s, coll->s.n, x->s.s, x->s.n) != NULL;
    case V_LIST: for (size_t i = 0; i < coll->l.n; i++) if (veq(x, coll->l.v[i])) return true; return false;
    case V_DICT: return dgetv((jdict *)&coll->d, x) != NULL;
    case V_UNDEF: if (coll->unsafe) undef_fail(c, line, coll); return false;
    default: rfail(c, line, PLN_JINJA_ERROR, "argument of type '%s' is not iterable", type_name(coll));
    }
}
/* The items a for loop (or list()) sees: list items, dict keys, string characters. */
static jlist iter_items(rctx *c, int line, jv *v) {
    jlist r = {0};
    switch (v->t) {
    case V_LIST: return v->l;
    case V_DICT: for (size_t i = 0; i < v->d.n; i++) lpush(c, &r, v->d.k[i]); return r;
    case V_STR:
        for (size_t i = 0; i < v->s.n;) { size_t a; u8dec(v->s.s + i, v->s.n - i, &a); lpush(c, &r, vstrn(c, v->s.s + i, a)); i += a; }
        return r;
    case V_UNDEF: if (v->unsafe) undef_fail(c, line, v); return r;
    default: rfail(c, line, PLN_JINJA_ERROR, "'%s' object is not iterable", type_name(v));
    }
}
static int64_t vlen(rctx *c, int line, const jv *v) {
    switch (v->t) {
    case V_STR: return (int64_t)u8len(v->s.s, v->s.n);
    case V_LIST: return (int64_t)v->l.n;
    case V_DICT: return (int64_t)v->d.n;
    case V_UNDEF: if (v->unsafe) undef_fail(c, line, v); return 0;
    default: rfail(c, line, PLN_JINJA_ERROR, "object of type '%s' has no len()", type_name(v));
    }
}

/* ---- attribute and item access ----------------------------------------------------------- */
static const char *const str_methods[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit",
    "upper", "lower", "title", "capitalize", "replace", "find", "rfind", "count", "join", "splitlines", "isdigit",
    "isalpha", "isalnum", "isspace", "islower", "isupper", "format", "index", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const dict_unsafe[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
static const char *const list_methods[] = {"index", "count", "copy", NULL};
static const char *const list_unsafe[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", NULL};
static bool in_names(const char *const *l, const char *s, size_t n) {
    for (int i = 0; l[i]; i++) if (strlen(l[i]) == n && !memcmp(l[i], s, n)) return true;
    return false;
}
static jv *method(rctx *c, jv *self, const char *name) { jv *m = vnew(c, V_METHOD); m->m.self = self; m->m.name = name; return m; }
static jv *unsafe_attr(rctx *c, jv *obj, const char *name) {
    jv *u = vundef(c, "access to attribute '%s' of '%s' object is unsafe (the sandbox keeps values immutable; "
                      "use a namespace() or build a new list with +)", name, type_name(obj));
    u->unsafe = true;
    return u;
}
static jv *loop_attr(rctx *c, int line, jv *lv, const char *a);
static jv *getattr_v(rctx *c, int line, jv *obj, const char *a, size_t an) {
    switch (obj->t) {
    case V_UNDEF: undef_fail(c, line, obj);
    case V_STR:
        if (in_names(str_methods, a, an)) return method(c, obj, a);
        break;
    case V_DICT:
        if (in_names(dict_methods, a, an)) return method(c, obj, a);
        if (in_names(dict_unsafe, a, an)) return unsafe_attr(c, obj, a);
        { jv **r = dget(&obj->d, a, an); if (r) return *r; }
        break;
    case V_NS: { jv **r = dget(&obj->d, a, an); if (r) return *r; } break;
    case V_LIST:
        if (in_names(list_methods, a, an)) return method(c, obj, a);
        if (in_names(list_unsafe, a, an)) return unsafe_attr(c, obj, a);
        break;
    case V_LOOP: return loop_attr(c, line, obj, a);
    default: break;
    }
    return vundef(c, "'%s object' has no attribute '%.*s'", type_name(obj), (int)an, a);
}
static jv *getitem_v(rctx *c, int line, jv *obj, jv *key) {
    switch (obj->t) {
    case V_UNDEF: undef_fail(c, line, obj);
    case V_DICT: case V_NS: { jv **r = dgetv(&obj->d, key); if (r) return *r; } break;
    case V_LIST: case V_STR:
        if (key->t == V_INT || key->t == V_BOOL) {
            int64_t n = vlen(c, line, obj), i = numi(key);
            if (i < 0) i += n;
            if (i < 0 || i >= n) return vundef(c, "%s object has no element %" PRId64, type_name(obj), numi(key));
            if (obj->t == V_LIST) return obj->l.v[i];
            size_t o = u8off(obj->s.s, obj->s.n, (size_t)i), a;
            u8dec(obj->s.s + o, obj->s.n - o, &a);
            return vstrn(c, obj->s.s + o, a);
        }
        break;
    default: break;
    }
    if (key->t == V_STR) return getattr_v(c, line, obj, key->s.s, key->s.n);
    sbuf b = {0}; repr_into(c, &b, key);
    return vundef(c, "%s object has no element %s", type_name(obj), b.p);
}
static jv *slice_v(rctx *c, int line, jv *obj, jv *a, jv *b, jv *st) {
    if (obj->t == V_UNDEF) undef_fail(c, line, obj);
    if (obj->t != V_LIST && obj->t != V_STR) rfail(c, line, PLN_JINJA_ERROR, "'%s' object is not subscriptable", type_name(obj));
    int64_t n = vlen(c, line, obj), step = 1;
    for (jv **p = (jv *[]){a, b, st}, **e = p + 3; p < e; p++)
        if (*p && (*p)->t != V_NONE && (*p)->t != V_INT && (*p)->t != V_BOOL)
            rfail(c, line, PLN_JINJA_ERROR, "slice indices must be integers or None");
    if (st && st->t != V_NONE) step = numi(st);
    if (step == 0) rfail(c, line, PLN_JINJA_ERROR, "slice step cannot be zero");
    int64_t lo, hi;
    if (step > 0) {
        lo = a && a->t != V_NONE ? numi(a) : 0; hi = b && b->t != V_NONE ? numi(b) : n;
        if (lo < 0) { lo += n; if (lo < 0) lo = 0; } if (lo > n) lo = n;
        if (hi < 0) { hi += n; if (hi < 0) hi = 0; } if (hi > n) hi = n;
    } else {
        lo = a && a->t != V_NONE ? numi(a) : n - 1; hi = b && b->t != V_NONE ? numi(b) : -1 - n;
        if (lo < 0) { lo += n; if (lo < 0) lo = -1; } if (lo >= n) lo = n - 1;
        if (hi < 0) { hi += n; if (hi < 0) hi = -1; } if (hi >= n) hi = n - 1;
    }
    jlist items = obj->t == V_LIST ? obj->l : iter_items(c, line, obj);
    jv *r = vlist(c);
    sbuf sb = {0};
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
        if (obj->t == V_LIST) lpush(c, &r->l, items.v[i]);
        else sb_put(c, &sb, items.v[i]->s.s, items.v[i]->s.n);
    }
    if (obj->t == V_STR) return sb_val(c, &sb);
    r->tuple = obj->tuple;
    return r;
}

/* ---- tojson: Python's json.dumps as transformers calls it --------------------------------- */
static void json_str(rctx *c, sbuf *b, const char *s, size_t n) {
    sb_puts(c, b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char tmp[8];
        switch (ch) {
        case '"': sb_puts(c, b, "\\\""); break;
        case '\\': sb_puts(c, b, "\\\\"); break;
        case '\n': sb_puts(c, b, "\\n"); break;
        case '\r': sb_puts(c, b, "\\r"); break;
        case '\t': sb_puts(c, b, "\\t"); break;
        case '\b': sb_puts(c, b, "\\b"); break;
        case '\f': sb_puts(c, b, "\\f"); break;
        default:
            if (ch < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", ch); sb_puts(c, b, tmp); }
            else sb_put(c, b, s + i, 1);
        }
    }
    sb_puts(c, b, "\"");
}
static void json_dump(rctx *c, int line, sbuf *b, const jv *v, int indent, int level, const char *isep, const char *ksep) {
    char tmp[64];
    if (++c->depth > 200) rfail(c, line, PLN_JINJA_LIMIT, "tojson: value nested too deeply");
    switch (v->t) {
    case V_NONE: sb_puts(c, b, "null"); break;
    case V_BOOL: sb_puts(c, b, v->b ? "true" : "false"); break;
    case V_INT: snprintf(tmp, sizeof tmp, "%" PRId64, v->i); sb_puts(c, b, tmp); break;
    case V_FLOAT:
        if (isnan(v->f)) sb_puts(c, b, "NaN");
        else if (isinf(v->f)) sb_puts(c, b, v->f < 0 ? "-Infinity" : "Infinity");
        else { fmt_float(v->f, tmp, sizeof tmp); sb_puts(c, b, tmp); }
        break;
    case V_STR: json_str(c, b, v->s.s, v->s.n); break;
    case V_LIST: case V_DICT: {
        bool isl = v->t == V_LIST;
        size_t n = isl ? v->l.n : v->d.n;
        sb_puts(c, b, isl ? "[" : "{");
        if (n) {
            for (size_t i = 0; i < n; i++) {
                if (i) sb_puts(c, b, isep);
                if (indent >= 0) { sb_puts(c, b, "\n"); for (int k = 0; k < indent * (level + 1); k++) sb_puts(c, b, " "); }
                if (!isl) {
                    const jv *k = v->d.k[i];
                    if (k->t == V_STR) json_str(c, b, k->s.s, k->s.n);
                    else if (k->t == V_NONE) sb_puts(c, b, "\"null\"");
                    else if (k->t == V_BOOL) sb_puts(c, b, k->b ? "\"true\"" : "\"false\"");
                    else if (k->t == V_INT || k->t == V_FLOAT) { sb_puts(c, b, "\""); str_into(c, b, k); sb_puts(c, b, "\""); }
                    else rfail(c, line, PLN_JINJA_ERROR, "tojson: keys must be str, int, float, bool or None, not %s", type_name(k));
                    sb_puts(c, b, ksep);
                }
                json_dump(c, line, b, isl ? v->l.v[i] : v->d.v[i], indent, level + 1, isep, ksep);
            }
            if (indent >= 0) { sb_puts(c, b, "\n"); for (int k = 0; k < indent * level; k++) sb_puts(c, b, " "); }
        }
        sb_puts(c, b, isl ? "]" : "}");
        break;
    }
    default:
        rfail(c, line, PLN_JINJA_ERROR, "tojson: Object of type %s is not JSON serializable", type_name(v));
    }
    c->depth--;
}

/* ---- calls: arguments, filters, tests, methods, globals ---------------------------------- */
typedef struct { jv **pos; size_t np; const node *const *kn; jv **kv; size_t nk; } jargs;
static jv *arg(const jargs *a, size_t i, const char *name) {
    if (i < a->np) return a->pos[i];
    for (size_t k = 0; k < a->nk; k++) if (name && !strcmp(a->kn[k]->s, name)) return a->kv[k];
    return NULL;
}
static void out_put(rctx *c, int line, const char *s, size_t n) {
    obuf *o = c->out;
    if (o->n + n > c->lim.max_output)
        rfail(c, line, PLN_JINJA_LIMIT, "the rendered output passed %zu bytes (the sandbox's bound)", c->lim.max_output);
    if (o->n + n + 1 > o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 1024;
        while (nc < o->n + n + 1) nc *= 2;
        char *np;
        if (o->in_arena) { np = ralloc(c, nc); if (o->n) memcpy(np, o->p, o->n); }
        else if (!(np = realloc(o->p, nc))) rfail(c, line, PLN_JINJA_LIMIT, "out of memory");
        o->p = np; o->cap = nc;
    }
    memcpy(o->p + o->n, s, n); o->n += n; o->p[o->n] = 0;
}
static jv *need_str(rctx *c, int line, jv *v, const char *what) {
    if (v->t == V_UNDEF) undef_fail(c, line, v);
    if (v->t != V_STR) rfail(c, line, PLN_JINJA_ERROR, "%s expects a string, got %s", what, type_name(v));
    return v;
}
static int64_t need_int(rctx *c, int line, jv *v, const char *what) {
    if (v->t == V_UNDEF) undef_fail(c, line, v);
    if (v->t != V_INT && v->t != V_BOOL) rfail(c, line, PLN_JINJA_ERROR, "%s expects an integer, got %s", what, type_name(v));
    return numi(v);
}
static bool chars_has(const jv *chars, uint32_t cp) {
    for (size_t i = 0; i < chars->s.n;) { size_t a; if (u8dec(chars->s.s + i, chars->s.n - i, &a) == cp) return true; i += a; }
    return false;
}
/* str.strip/lstrip/rstrip([chars]); which: 1 left, 2 right, 3 both */
static jv *py_strip(rctx *c, jv *s, jv *chars, int which) {
    size_t b = 0, e = s->s.n;
    if (!chars || chars->t == V_NONE) {
        if (which & 1) b = ws_prefix(s->s.s, s->s.n);
        if (which & 2) { e = ws_suffix_start(s->s.s + b, s->s.n - b) + b; }
    } else {
        size_t a;
        if (which & 1) while (b < e && chars_has(chars, u8dec(s->s.s + b, e - b, &a))) b += a;
        if (which & 2) while (e > b) {
            size_t st = e - 1; while (st > b && ((unsigned char)s->s.s[st] & 0xC0) == 0x80) st--;
            if (!chars_has(chars, u8dec(s->s.s + st, e - st, &a))) break;
            e = st;
        }
    }
    return vstrn(c, s->s.s + b, e - b);
}
static jv *py_case(rctx *c, jv *s, int mode) {   /* 0 lower, 1 upper, 2 str.title, 3 capitalize, 4 jinja title */
    char *d = ralloc(c, s->s.n + 1);
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s->s.n; i++) {
        unsigned char ch = (unsigned char)s->s.s[i];
        bool alpha = isalpha(ch) && ch < 0x80;
        char o = (char)ch;
        if (mode == 0 && alpha) o = (char)tolower(ch);
        else if (mode == 1 && alpha) o = (char)toupper(ch);
        else if (mode == 2) { if (alpha) o = (char)(prev_cased ? tolower(ch) : toupper(ch)); prev_cased = alpha || ch >= 0x80; }
        else if (mode == 3) { if (alpha) o = (char)(first ? toupper(ch) : tolower(ch)); }
        else if (mode == 4) {
            bool sep = ch == '-' || ch == '(' || ch == '{' || ch == '[' || ch == '<' || is_ws((char)ch);
            if (!sep && alpha) o = (char)(prev_cased ? tolower(ch) : toupper(ch));
            prev_cased = !sep;
        }
        if (((unsigned char)s->s.s[i] & 0xC0) != 0x80) first = false;
        d[i] = o;
    }
    jv *v = vnew(c, V_STR); v->s.s = d; v->s.n = s->s.n; return v;
}
static jv *py_replace(rctx *c, jv *s, jv *old, jv *nw, int64_t count) {
    sbuf b = {0};
    if (!old->s.n) {   /* Python inserts between every character */
        int64_t k = 0;
        for (size_t i = 0; i <= s->s.n;) {
            if (count < 0 || k < count) { sb_put(c, &b, nw->s.s, nw->s.n); k++; }
            if (i == s->s.n) break;
            size_t a; u8dec(s->s.s + i, s->s.n - i, &a); sb_put(c, &b, s->s.s + i, a); i += a;
        }
        return sb_val(c, &b);
    }
    size_t i = 0; int64_t k = 0;
    while (i < s->s.n) {
        const char *f = (count < 0 || k < count) ? memmem(s->s.s + i, s->s.n - i, old->s.s, old->s.n) : NULL;
        if (!f) { sb_put(c, &b, s->s.s + i, s->s.n - i); break; }
        sb_put(c, &b, s->s.s + i, (size_t)(f - s->s.s) - i);
        sb_put(c, &b, nw->s.s, nw->s.n);
        i = (size_t)(f - s->s.s) + old->s.n; k++;
    }
    jv *r = sb_val(c, &b);
    if (!r->s.s) r->s.s = "";
    return r;
}
static jv *py_split(rctx *c, int line, jv *s, jv *sep, int64_t maxsplit) {
    jv *r = vlist(c);
    const char *p = s->s.s; size_t n = s->s.n, i = 0;
    if (!sep || sep->t == V_NONE) {
        int64_t k = 0;
        while (1) {
            i += ws_prefix(p + i, n - i);
            if (i >= n) break;
            if (maxsplit >= 0 && k >= maxsplit) { size_t e = ws_suffix_start(p + i, n - i); lpush(c, &r->l, vstrn(c, p + i, e)); break; }
            size_t j = i, a;
            while (j < n && !py_space(u8dec(p + j, n - j, &a))) j += a;
            lpush(c, &r->l, vstrn(c, p + i, j - i)); k++;
            i = j;
        }
        return r;
    }
    need_str(c, line, sep, "split()");
    if (!sep->s.n) rfail(c, line, PLN_JINJA_ERROR, "split(): empty separator");
    int64_t k = 0;
    while (1) {
        const char *f = (maxsplit < 0 || k < maxsplit) ? memmem(p + i, n - i, sep->s.s, sep->s.n) : NULL;
        if (!f) { lpush(c, &r->l, vstrn(c, p + i, n - i)); break; }
        lpush(c, &r->l, vstrn(c, p + i, (size_t)(f - p) - i)); k++;
        i = (size_t)(f - p) + sep->s.n;
    }
    return r;
}
static bool py_startswith(rctx *c, int line, jv *s, jv *pre, bool end) {
    if (pre->t == V_LIST) { for (size_t i = 0; i < pre->l.n; i++) if (py_startswith(c, line, s, pre->l.v[i], end)) return true; return false; }
    need_str(c, line, pre, end ? "endswith()" : "startswith()");
    if (pre->s.n > s->s.n) return false;
    return !memcmp(end ? s->s.s + s->s.n - pre->s.n : s->s.s, pre->s.s, pre->s.n);
}

static jv *call_value(rctx *c, int line, jv *fn, const jargs *a);
static bool apply_test(rctx *c, int line, const char *name, jv *v, const jargs *a);
static jv *apply_filter(rctx *c, int line, const char *name, jv *v, const jargs *a);

static jv *call_method(rctx *c, int line, jv *self, const char *m, const jargs *a) {
    #define M(x) (!strcmp(m, x))
    jv *a0 = arg(a, 0, NULL), *a1 = arg(a, 1, NULL);
    if (self->t == V_STR) {
        if (M("startswith") || M("endswith")) { if (!a0) rfail(c, line, PLN_JINJA_ERROR, "%s() takes a prefix", m); return vbool(py_startswith(c, line, self, a0, M("endswith"))); }
        if (M("strip")) return py_strip(c, self, a0, 3);
        if (M("lstrip")) return py_strip(c, self, a0, 1);
        if (M("rstrip")) return py_strip(c, self, a0, 2);
        if (M("split") || M("rsplit")) {
            jv *sep = arg(a, 0, "sep"), *mx = arg(a, 1, "maxsplit");
            if (M("rsplit") && mx && need_int(c, line, mx, "rsplit()") >= 0) rfail(c, line, PLN_JINJA_ERROR, "rsplit() with maxsplit is not supported by pollen's Jinja");
            return py_split(c, line, self, sep, mx ? need_int(c, line, mx, "split()") : -1);
        }
        if (M("upper")) return py_case(c, self, 1);
        if (M("lower")) return py_case(c, self, 0);
        if (M("title")) return py_case(c, self, 2);
        if (M("capitalize")) return py_case(c, self, 3);
        if (M("replace")) {
            if (!a0 || !a1) rfail(c, line, PLN_JINJA_ERROR, "replace() takes 2 or 3 arguments");
            jv *cnt = arg(a, 2, NULL);
            return py_replace(c, self, need_str(c, line, a0, "replace()"), need_str(c, line, a1, "replace()"), cnt ? need_int(c, line, cnt, "replace()") : -1);
        }
        if (M("find") || M("rfind") || M("index") || M("count")) {
            if (!a0) rfail(c, line, PLN_JINJA_ERROR, "%s() takes an argument", m);
            need_str(c, line, a0, m);
            if (M("count")) {
                if (!a0->s.n) return vint(c, (int64_t)u8len(self->s.s, self->s.n) + 1);
                int64_t k = 0; const char *p = self->s.s, *e = p + self->s.n, *f;
                while ((f = memmem(p, (size_t)(e - p), a0->s.s, a0->s.n))) { k++; p = f + a0->s.n; }
                return vint(c, k);
            }
            const char *f = NULL;
            if (M("rfind")) { for (size_t i = self->s.n + 1; i-- > 0;) if (i + a0->s.n <= self->s.n && !memcmp(self->s.s + i, a0->s.s, a0->s.n)) { f = self->s.s + i; break; } }
            else f = a0->s.n ? memmem(self->s.s, self->s.n, a0->s.s, a0->s.n) : self->s.s;
            if (!f && M("index")) rfail(c, line, PLN_JINJA_ERROR, "substring not found");
            return vint(c, f ? (int64_t)u8len(self->s.s, (size_t)(f - self->s.s)) : -1);
        }
        if (M("join")) {
            if (!a0) rfail(c, line, PLN_JINJA_ERROR, "join() takes an iterable");
            jlist it = iter_items(c, line, a0); sbuf b = {0};
            for (size_t i = 0; i < it.n; i++) {
                if (i) sb_put(c, &b, self->s.s, self->s.n);
                if (it.v[i]->t != V_STR) rfail(c, line, PLN_JINJA_ERROR, "sequence item %zu: expected str instance, %s found", i, type_name(it.v[i]));
                sb_put(c, &b, it.v[i]->s.s, it.v[i]->s.n);
            }
            jv *r = sb_val(c, &b); if (!r->s.s) r->s.s = ""; return r;
        }
        if (M("splitlines")) {
            jv *r = vlist(c); size_t i = 0, n = self->s.n; const char *p = self->s.s;
            while (i < n) {
                size_t j = i; while (j < n && p[j] != '\n' && p[j] != '\r') j++;
                lpush(c, &r->l, vstrn(c, p + i, j - i));
                if (j < n && p[j] == '\r' && j + 1 < n && p[j + 1] == '\n') j++;
                i = j + 1;
            }
            return r;
        }
        if (M("isdigit") || M("isalpha") || M("isalnum") || M("isspace") || M("islower") || M("isupper")) {
            if (!self->s.n) return &V_FALSE_C;
            bool any_cased = false;
            for (size_t i = 0; i < self->s.n; i++) {
                unsigned char ch = (unsigned char)self->s.s[i];
                if (ch >= 0x80) return &V_FALSE_C;
                if (M("isdigit") && !isdigit(ch)) return &V_FALSE_C;
                if (M("isalpha") && !isalpha(ch)) return &V_FALSE_C;
                if (M("isalnum") && !isalnum(ch)) return &V_FALSE_C;
                if (M("isspace") && !is_ws((char)ch)) return &V_FALSE_C;
                if (M("islower") && isupper(ch)) return &V_FALSE_C;
                if (M("isupper") && islower(ch)) return &V_FALSE_C;
                any_cased |= isalpha(ch) != 0;
            }
            return vbool((!M("islower") && !M("isupper")) || any_cased);
        }
        rfail(c, line, PLN_JINJA_ERROR, "str.%s() is not supported by pollen's Jinja", m);
    }
    if (self->t == V_DICT) {
        if (M("items") || M("keys") || M("values")) {
            jv *r = vlist(c);
            for (size_t i = 0; i < self->d.n; i++) {
                if (M("keys")) lpush(c, &r->l, self->d.k[i]);
                else if (M("values")) lpush(c, &r->l, self->d.v[i]);
                else { jv *t = vlist(c); t->tuple = true; lpush(c, &t->l, self->d.k[i]); lpush(c, &t->l, self->d.v[i]); lpush(c, &r->l, t); }
            }
            return r;
        }
        if (M("get")) {
            if (!a0) rfail(c, line, PLN_JINJA_ERROR, "get() takes a key");
            jv **r = dgetv(&self->d, a0);
            return r ? *r : a1 ? a1 : &V_NONE_C;
        }
        if (M("copy")) { jv *d = vnew(c, V_DICT); for (size_t i = 0; i < self->d.n; i++) dsetv(c, &d->d, self->d.k[i], self->d.v[i]); return d; }
    }
    if (self->t == V_LIST) {
        if (M("copy")) { jv *r = vlist(c); for (size_t i = 0; i < self->l.n; i++) lpush(c, &r->l, self->l.v[i]); return r; }
        if (!a0) rfail(c, line, PLN_JINJA_ERROR, "%s() takes an argument", m);
        int64_t k = 0;
        for (size_t i = 0; i < self->l.n; i++) if (veq(self->l.v[i], a0)) { if (M("index")) return vint(c, (int64_t)i); k++; }
        if (M("index")) rfail(c, line, PLN_JINJA_ERROR, "list.index(x): x not in list");
        return vint(c, k);
    }
    if (self->t == V_LOOP && M("cycle")) {
        if (!a->np) rfail(c, line, PLN_JINJA_ERROR, "loop.cycle() takes at least one argument");
        return a->pos[self->loop->idx % a->np];
    }
    rfail(c, line, PLN_JINJA_ERROR, "%s.%s() is not supported by pollen's Jinja", type_name(self), m);
    #undef M
}

static jv *loop_attr(rctx *c, int line, jv *lv, const char *a) {
    loopst *L = lv->loop;
    int64_t n = (int64_t)L->items.n, i = (int64_t)L->idx;
    if (!strcmp(a, "index")) return vint(c, i + 1);
    if (!strcmp(a, "index0")) return vint(c, i);
    if (!strcmp(a, "revindex")) return vint(c, n - i);
    if (!strcmp(a, "revindex0")) return vint(c, n - i - 1);
    if (!strcmp(a, "first")) return vbool(i == 0);
    if (!strcmp(a, "last")) return vbool(i == n - 1);
    if (!strcmp(a, "length")) return vint(c, n);
    if (!strcmp(a, "depth")) return vint(c, 1);
    if (!strcmp(a, "depth0")) return vint(c, 0);
    if (!strcmp(a, "previtem")) return i > 0 ? L->items.v[i - 1] : vundef(c, "there is no previous item");
    if (!strcmp(a, "nextitem")) return i + 1 < n ? L->items.v[i + 1] : vundef(c, "there is no next item");
    if (!strcmp(a, "cycle")) return method(c, lv, "cycle");
    rfail(c, line, PLN_JINJA_ERROR, "loop.%s is not supported by pollen's Jinja", a);
}

/* jinja2's make_attrgetter: "a.b.0" walks getitem (integers) and attributes */
static jv *attr_path(rctx *c, int line, jv *v, jv *path) {
    if (path->t == V_INT) return getitem_v(c, line, v, path);
    need_str(c, line, path, "attribute=");
    const char *s = path->s.s, *e = s + path->s.n;
    while (s <= e) {
        const char *d = memchr(s, '.', (size_t)(e - s)); if (!d) d = e;
        bool digits = d > s; for (const char *q = s; q < d; q++) if (!isdigit((unsigned char)*q)) digits = false;
        if (digits) v = getitem_v(c, line, v, vint(c, strtoll(s, NULL, 10)));
        else { jv *k = vstrn(c, s, (size_t)(d - s)); v = getitem_v(c, line, v, k); }
        s = d + 1;
    }
    return v;
}

static jargs shift_args(const jargs *a, size_t k) {
    jargs r = *a;
    if (r.np >= k) { r.pos += k; r.np -= k; } else { r.pos += r.np; r.np = 0; }
    return r;
}
static jv *lower_if_str(rctx *c, jv *v) { return v->t == V_STR ? py_case(c, v, 0) : v; }

static void sort_items(rctx *c, int line, jlist *l, bool reverse, bool cs, jv *attr) {
    /* stable insertion sort on keys; Python's sorted() is stable */
    jv **keys = ralloc(c, (l->n + 1) * sizeof *keys);
    for (size_t i = 0; i < l->n; i++) { jv *k = attr ? attr_path(c, line, l->v[i], attr) : l->v[i]; keys[i] = cs ? k : lower_if_str(c, k); }
    for (size_t i = 1; i < l->n; i++) {
        jv *k = keys[i], *v = l->v[i]; size_t j = i;
        while (j > 0) {
            int r = vcmp(c, line, keys[j - 1], k, "<");
            if (reverse ? r >= 0 : r <= 0) break;
            keys[j] = keys[j - 1]; l->v[j] = l->v[j - 1]; j--;
            if (++c->steps > c->lim.max_steps) rfail(c, line, PLN_JINJA_LIMIT, "sort: over %" PRIu64 " steps (the sandbox's bound)", c->lim.max_steps);
        }
        keys[j] = k; l->v[j] = v;
    }
}

static jv *apply_filter(rctx *c, int line, const char *name, jv *v, const jargs *a) {
    #define F(x) (!strcmp(name, x))
    jv *a0 = arg(a, 0, NULL);
    if (v->t == V_UNDEF && v->unsafe) undef_fail(c, line, v);
    if (F("default") || F("d")) {
        jv *dv = arg(a, 0, "default_value"), *b = arg(a, 1, "boolean");
        if (v->t == V_UNDEF || (b && truthy(b) && !truthy(v))) return dv ? dv : vstr(c, "");
        return v;
    }
    if (F("length") || F("count")) return vint(c, vlen(c, line, v));
    if (F("string")) return tostr(c, v);
    if (F("safe")) return tostr(c, v);
    if (F("list")) { jv *r = vlist(c); jlist it = iter_items(c, line, v); for (size_t i = 0; i < it.n; i++) lpush(c, &r->l, it.v[i]); return r; }
    if (F("tojson")) {
        jv *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators"), *ea = arg(a, 0, "ensure_ascii"), *sk = arg(a, 3, "sort_keys");
        if (ea && truthy(ea)) rfail(c, line, PLN_JINJA_ERROR, "tojson(ensure_ascii=true) is not supported by pollen's Jinja");
        if (sk && truthy(sk)) rfail(c, line, PLN_JINJA_ERROR, "tojson(sort_keys=true) is not supported by pollen's Jinja");
        int indent = -1;
        if (ind && ind->t != V_NONE) indent = (int)need_int(c, line, ind, "tojson(indent=)");
        if (indent > 64) indent = 64;
        const char *isep = indent >= 0 ? "," : ", ", *ksep = ": ";
        if (sep && sep->t != V_NONE) {
            if (sep->t != V_LIST || sep->l.n != 2 || sep->l.v[0]->t != V_STR || sep->l.v[1]->t != V_STR)
                rfail(c, line, PLN_JINJA_ERROR, "tojson(separators=) takes a pair of strings");
            isep = sep->l.v[0]->s.s; ksep = sep->l.v[1]->s.s;
        }
        if (v->t == V_UNDEF) rfail(c, line, PLN_JINJA_ERROR, "tojson: Object of type Undefined is not JSON serializable");
        sbuf b = {0}; json_dump(c, line, &b, v, indent, 0, isep, ksep); return sb_val(c, &b);
    }
    if (F("items")) {
        if (v->t == V_UNDEF) return vlist(c);
        if (v->t != V_DICT) rfail(c, line, PLN_JINJA_ERROR, "items: can only get item pairs from a mapping, not %s", type_name(v));
        return call_method(c, line, v, "items", &(jargs){0});
    }
    if (F("first") || F("last")) {
        jlist it = iter_items(c, line, v);
        if (!it.n) return vundef(c, "No %s item, sequence was empty.", F("first") ? "first" : "last");
        return F("first") ? it.v[0] : it.v[it.n - 1];
    }
    if (F("join")) {
        jv *d = arg(a, 0, "d"), *at = arg(a, 1, "attribute");
        jlist it = iter_items(c, line, v); sbuf b = {0};
        for (size_t i = 0; i < it.n; i++) {
            if (i && d) str_into(c, &b, d);
            str_into(c, &b, at ? attr_path(c, line, it.v[i], at) : it.v[i]);
        }
        jv *r = sb_val(c, &b); if (!r->s.s) r->s.s = ""; return r;
    }
    /* jinja2's map, select, reject, selectattr and rejectattr start with "if value:": a false
     * value (none, "", 0, undefined) gives an empty sequence rather than an error */
    if ((F("map") || F("select") || F("reject") || F("selectattr") || F("rejectattr")) && !truthy(v)) return vlist(c);
    if (F("map")) {
        jv *at = arg(a, SIZE_MAX, "attribute");
        jlist it = iter_items(c, line, v); jv *r = vlist(c);
        if (at) {
            jv *dflt = arg(a, SIZE_MAX, "default");
            for (size_t i = 0; i < it.n; i++) { jv *x = attr_path(c, line, it.v[i], at); lpush(c, &r->l, x->t == V_UNDEF && dflt ? dflt : x); }
            return r;
        }
        if (!a0) rfail(c, line, PLN_JINJA_ERROR, "map: give a filter name or attribute=");
        need_str(c, line, a0, "map()");
        jargs rest = shift_args(a, 1);
        for (size_t i = 0; i < it.n; i++) lpush(c, &r->l, apply_filter(c, line, a0->s.s, it.v[i], &rest));
        return r;
    }
    if (F("select") || F("reject") || F("selectattr") || F("rejectattr")) {
        bool attr = F("selectattr") || F("rejectattr"), want = F("select") || F("selectattr");
        jlist it = iter_items(c, line, v); jv *r = vlist(c);
        jv *at = attr ? a0 : NULL;
        if (attr && !at) rfail(c, line, PLN_JINJA_ERROR, "%s needs an attribute name", name);
        jv *tn = arg(a, attr ? 1 : 0, NULL);
        if (tn) need_str(c, line, tn, name);
        jargs rest = shift_args(a, attr ? 2 : 1);
        for (size_t i = 0; i < it.n; i++) {
            jv *x = at ? attr_path(c, line, it.v[i], at) : it.v[i];
            bool ok = tn ? apply_test(c, line, tn->s.s, x, &rest) : truthy(x);
            if (ok == want) lpush(c, &r->l, it.v[i]);
        }
        return r;
    }
    if (F("unique")) {
        jv *cs = arg(a, 0, "case_sensitive"), *at = arg(a, 1, "attribute");
        jlist it = iter_items(c, line, v); jv *r = vlist(c), *seen = vlist(c);
        for (size_t i = 0; i < it.n; i++) {
            jv *k = at ? attr_path(c, line, it.v[i], at) : it.v[i];
            if (!(cs && truthy(cs))) k = lower_if_str(c, k);
            bool dup = false;
            for (size_t j = 0; j < seen->l.n && !dup; j++) dup = veq(seen->l.v[j], k);
            if (!dup) { lpush(c, &seen->l, k); lpush(c, &r->l, it.v[i]); }
        }
        return r;
    }
    if (F("sort")) {
        jv *rv = arg(a, 0, "reverse"), *cs = arg(a, 1, "case_sensitive"), *at = arg(a, 2, "attribute");
        jlist it = iter_items(c, line, v); jv *r = vlist(c);
        for (size_t i = 0; i < it.n; i++) lpush(c, &r->l, it.v[i]);
        sort_items(c, line, &r->l, rv && truthy(rv), cs && truthy(cs), at);
        return r;
    }
    if (F("reverse")) {
        if (v->t == V_STR) { jlist it = iter_items(c, line, v); sbuf b = {0}; for (size_t i = it.n; i-- > 0;) sb_put(c, &b, it.v[i]->s.s, it.v[i]->s.n); jv *r = sb_val(c, &b); if (!r->s.s) r->s.s = ""; return r; }
        jlist it = iter_items(c, line, v); jv *r = vlist(c);
        for (size_t i = it.n; i-- > 0;) lpush(c, &r->l, it.v[i]);
        return r;
    }
    if (F("sum")) {
        jv *at = arg(a, 0, "attribute"), *st = arg(a, 1, "start");
        jlist it = iter_items(c, line, v);
        bool fl = st && st->t == V_FLOAT; double f = st ? numf(st) : 0; int64_t i0 = st && !fl ? numi(st) : 0;
        for (size_t i = 0; i < it.n; i++) {
            jv *x = at ? attr_path(c, line, it.v[i], at) : it.v[i];
            if (!is_num(x)) rfail(c, line, PLN_JINJA_ERROR, "sum: unsupported operand type %s", type_name(x));
            if (x->t == V_FLOAT && !fl) { fl = true; f = (double)i0; }
            if (fl) f += numf(x); else if (__builtin_add_overflow(i0, numi(x), &i0)) rfail(c, line, PLN_JINJA_ERROR, "sum: integer overflow");
        }
        return fl ? vfloat(c, f) : vint(c, i0);
    }
    if (F("int")) {
        jv *dflt = arg(a, 0, "default"), *base = arg(a, 1, "base");
        if (v->t == V_INT) return v;
        if (v->t == V_BOOL) return vint(c, v->b);
        if (v->t == V_FLOAT) { if (!isfinite(v->f) || fabs(v->f) >= 9.2e18) return dflt ? dflt : vint(c, 0); return vint(c, (int64_t)v->f); }
        if (v->t == V_STR) {
            char *e; errno = 0;
            int bs = base ? (int)need_int(c, line, base, "int(base=)") : 10;
            const char *tmp = vstrn(c, v->s.s, v->s.n)->s.s;
            long long x = strtoll(tmp, &e, bs);
            while (*e && is_ws(*e)) e++;
            if (!errno && e != tmp && !*e) return vint(c, x);
            double f = strtod(tmp, &e); while (*e && is_ws(*e)) e++;
            if (e != tmp && !*e && isfinite(f) && fabs(f) < 9.2e18) return vint(c, (int64_t)f);
        }
        return dflt ? dflt : vint(c, 0);
    }
    if (F("float")) {
        jv *dflt = arg(a, 0, "default");
        if (is_num(v)) return vfloat(c, numf(v));
        if (v->t == V_STR) {
            const char *tmp = vstrn(c, v->s.s, v->s.n)->s.s; char *e;
            double f = strtod(tmp, &e); while (*e && is_ws(*e)) e++;
            if (e != tmp && !*e) return vfloat(c, f);
        }
        return dflt ? dflt : vfloat(c, 0);
    }
    if (F("abs")) {
        if (v->t == V_FLOAT) return vfloat(c, fabs(v->f));
        if (v->t == V_INT || v->t == V_BOOL) { int64_t i = numi(v); if (i == INT64_MIN) rfail(c, line, PLN_JINJA_ERROR, "abs: integer overflow"); return vint(c, i < 0 ? -i : i); }
        rfail(c, line, PLN_JINJA_ERROR, "bad operand type for abs(): '%s'", type_name(v));
    }
    if (F("round")) {
        jv *pr = arg(a, 0, "precision"), *me = arg(a, 1, "method");
        int p = pr ? (int)need_int(c, line, pr, "round(precision=)") : 0;
        if (!is_num(v)) rfail(c, line, PLN_JINJA_ERROR, "round: expected a number, got %s", type_name(v));
        double x = numf(v);
        if (me && !streq(me, "common", 6)) {
            double m = pow(10, p);
            if (streq(me, "ceil", 4)) return vfloat(c, ceil(x * m) / m);
            if (streq(me, "floor", 5)) return vfloat(c, floor(x * m) / m);
            rfail(c, line, PLN_JINJA_ERROR, "round: method must be 'common', 'ceil' or 'floor'");
        }
        if (p < 0 || p > 300) rfail(c, line, PLN_JINJA_ERROR, "round: precision %d is not supported by pollen's Jinja", p);
        char buf[400]; snprintf(buf, sizeof buf, "%.*f", p, x);
        return vfloat(c, strtod(buf, NULL));
    }
    /* string filters: jinja2 converts the value with str() first */
    jv *s = tostr(c, v);
    if (F("trim")) return py_strip(c, s, arg(a, 0, "chars"), 3);
    if (F("upper")) return py_case(c, s, 1);
    if (F("lower")) return py_case(c, s, 0);
    if (F("title")) return py_case(c, s, 4);
    if (F("capitalize")) return py_case(c, s, 3);
    if (F("replace")) {
        jv *o = arg(a, 0, "old"), *n = arg(a, 1, "new"), *cnt = arg(a, 2, "count");
        if (!o || !n) rfail(c, line, PLN_JINJA_ERROR, "replace takes the old and new strings");
        return py_replace(c, s, tostr(c, o), tostr(c, n), cnt && cnt->t != V_NONE ? need_int(c, line, cnt, "replace(count=)") : -1);
    }
    if (F("indent")) {
        jv *w = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
        sbuf ind = {0};
        if (!w) sb_puts(c, &ind, "    ");
        else if (w->t == V_STR) sb_put(c, &ind, w->s.s, w->s.n);
        else { int64_t k = need_int(c, line, w, "indent(width=)"); for (int64_t i = 0; i < k && i < 1024; i++) sb_puts(c, &ind, " "); }
        if (!ind.p) ind.p = "";
        /* jinja2 appends "\n" before splitlines(), so a trailing newline survives */
        sbuf sn = {0}; sb_put(c, &sn, s->s.s, s->s.n); sb_puts(c, &sn, "\n");
        jv *lines = call_method(c, line, sb_val(c, &sn), "splitlines", &(jargs){0});
        sbuf b = {0};
        if (first && truthy(first)) sb_put(c, &b, ind.p, ind.n);
        for (size_t i = 0; i < lines->l.n; i++) {
            jv *ln = lines->l.v[i];
            if (i) { sb_puts(c, &b, "\n"); if (ln->s.n || (blank && truthy(blank))) sb_put(c, &b, ind.p, ind.n); }
            sb_put(c, &b, ln->s.s, ln->s.n);
        }
        jv *r = sb_val(c, &b); if (!r->s.s) r->s.s = ""; return r;
    }
    if (F("wordcount")) {
        int64_t k = 0; bool in = false;
        for (size_t i = 0; i < s->s.n; i++) {
            unsigned char ch = (unsigned char)s->s.s[i];
            bool w = isalnum(ch) || ch == '_' || ch >= 0x80;
            if (w && !in) k++;
            in = w;
        }
        return vint(c, k);
    }
    if (F("escape") || F("e")) {
        sbuf b = {0};
        for (size_t i = 0; i < s->s.n; i++) {
            char ch = s->s.s[i];
            if (ch == '&') sb_puts(c, &b, "&amp;"); else if (ch == '<') sb_puts(c, &b, "&lt;");
            else if (ch == '>') sb_puts(c, &b, "&gt;"); else if (ch == '"') sb_puts(c, &b, "&#34;");
            else if (ch == '\'') sb_puts(c, &b, "&#39;"); else sb_put(c, &b, &ch, 1);
        }
        jv *r = sb_val(c, &b); if (!r->s.s) r->s.s = ""; return r;
    }
    rfail(c, line, PLN_JINJA_ERROR, "the filter '%s' is not supported by pollen's Jinja (docs/JINJA.md lists what is)", name);
    #undef F
}

static bool apply_test(rctx *c, int line, const char *name, jv *v, const jargs *a) {
    #define T(x) (!strcmp(name, x))
    jv *a0 = arg(a, 0, NULL);
    if (T("defined")) return v->t != V_UNDEF;
    if (T("undefined")) return v->t == V_UNDEF;
    if (v->t == V_UNDEF && v->unsafe) undef_fail(c, line, v);
    if (T("none")) return v->t == V_NONE;
    if (T("string")) return v->t == V_STR;
    if (T("number")) return is_num(v);
    if (T("integer")) return v->t == V_INT;
    if (T("float")) return v->t == V_FLOAT;
    if (T("boolean")) return v->t == V_BOOL;
    if (T("true")) return v->t == V_BOOL && v->b;
    if (T("false")) return v->t == V_BOOL && !v->b;
    if (T("mapping")) return v->t == V_DICT;
    if (T("sequence")) return v->t == V_STR || v->t == V_LIST || v->t == V_DICT || v->t == V_UNDEF;
    if (T("iterable")) return v->t == V_STR || v->t == V_LIST || v->t == V_DICT || v->t == V_UNDEF || v->t == V_LOOP;
    if (T("callable")) return v->t == V_MACRO || v->t == V_BUILTIN || v->t == V_METHOD;
    if (T("lower") || T("upper")) {
        jv *s = tostr(c, v);
        return streq(py_case(c, s, T("lower") ? 0 : 1), s->s.s, s->s.n) && call_method(c, line, s, T("lower") ? "islower" : "isupper", &(jargs){0})->b;
    }
    if (T("odd") || T("even")) { int64_t x = need_int(c, line, v, name); return (x % 2 != 0) == T("odd"); }
    if (!a0) rfail(c, line, PLN_JINJA_ERROR, "the test '%s' %s", name, T("in") || T("eq") || T("divisibleby") || T("sameas") ? "takes an argument" : "is not supported by pollen's Jinja (docs/JINJA.md lists what is)");
    if (T("in")) return vin(c, line, v, a0);
    if (T("eq") || T("equalto") || T("==")) return veq(v, a0);
    if (T("ne") || T("!=")) return !veq(v, a0);
    if (T("lt") || T("lessthan") || T("<")) return vcmp(c, line, v, a0, "<") < 0;
    if (T("le") || T("<=")) return vcmp(c, line, v, a0, "<=") <= 0;
    if (T("gt") || T("greaterthan") || T(">")) return vcmp(c, line, v, a0, ">") > 0;
    if (T("ge") || T(">=")) return vcmp(c, line, v, a0, ">=") >= 0;
    if (T("sameas")) return v == a0 || (v->t == a0->t && (v->t == V_NONE || (v->t == V_BOOL && v->b == a0->b)));
    if (T("divisibleby")) { int64_t d = need_int(c, line, a0, "divisibleby"); if (!d) rfail(c, line, PLN_JINJA_ERROR, "integer modulo by zero"); return need_int(c, line, v, "divisibleby") % d == 0; }
    rfail(c, line, PLN_JINJA_ERROR, "the test '%s' is not supported by pollen's Jinja (docs/JINJA.md lists what is)", name);
    #undef T
}

/* ---- globals ----------------------------------------------------------------------------- */
enum { B_RANGE, B_NAMESPACE, B_DICT, B_RAISE, B_STRFTIME, B_COUNT };
static const char *const builtin_names[B_COUNT] = {"range", "namespace", "dict", "raise_exception", "strftime_now"};

static jv *call_builtin(rctx *c, int line, int b, const jargs *a) {
    switch (b) {
    case B_RANGE: {
        if (a->nk) rfail(c, line, PLN_JINJA_ERROR, "range() takes no keyword arguments");
        if (a->np < 1 || a->np > 3) rfail(c, line, PLN_JINJA_ERROR, "range expected 1 to 3 arguments, got %zu", a->np);
        int64_t lo = 0, hi, st = 1;
        if (a->np == 1) hi = need_int(c, line, a->pos[0], "range()");
        else { lo = need_int(c, line, a->pos[0], "range()"); hi = need_int(c, line, a->pos[1], "range()"); }
        if (a->np == 3) st = need_int(c, line, a->pos[2], "range()");
        if (!st) rfail(c, line, PLN_JINJA_ERROR, "range() arg 3 must not be zero");
        int64_t n = st > 0 ? (hi > lo ? (hi - lo + st - 1) / st : 0) : (lo > hi ? (lo - hi - st - 1) / -st : 0);
        if (n > 100000) rfail(c, line, PLN_JINJA_ERROR, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        jv *r = vlist(c);
        for (int64_t i = 0; i < n; i++) lpush(c, &r->l, vint(c, lo + i * st));
        return r;
    }
    case B_NAMESPACE: case B_DICT: {
        jv *d = vnew(c, b == B_NAMESPACE ? V_NS : V_DICT);
        for (size_t i = 0; i < a->np; i++) {
            if (a->pos[i]->t != V_DICT) rfail(c, line, PLN_JINJA_ERROR, "%s() takes keyword arguments or a mapping", builtin_names[b]);
            for (size_t k = 0; k < a->pos[i]->d.n; k++) dsetv(c, &d->d, a->pos[i]->d.k[k], a->pos[i]->d.v[k]);
        }
        for (size_t k = 0; k < a->nk; k++) dset(c, &d->d, a->kn[k]->s, a->kn[k]->sn, a->kv[k]);
        return d;
    }
    case B_RAISE: {
        jv *m = arg(a, 0, "message");
        jv *s = m ? tostr(c, m) : vstr(c, "");
        rfail(c, line, PLN_JINJA_RAISED, "%s", s->s.s);
    }
    case B_STRFTIME: {
        jv *f = arg(a, 0, "format");
        if (!f) rfail(c, line, PLN_JINJA_ERROR, "strftime_now() takes a format");
        need_str(c, line, f, "strftime_now()");
        time_t now = c->lim.now >= 0 ? (time_t)c->lim.now : time(NULL);
        struct tm tm;
        if (c->lim.now >= 0) gmtime_r(&now, &tm); else localtime_r(&now, &tm);
        char buf[512];
        size_t n = strftime(buf, sizeof buf, f->s.s, &tm);
        if (!n && f->s.n) rfail(c, line, PLN_JINJA_ERROR, "strftime_now(): the formatted date is empty or too long");
        return vstrn(c, buf, n);
    }
    }
    rfail(c, line, PLN_JINJA_ERROR, "unknown function");
}

/* ---- evaluation -------------------------------------------------------------------------- */
static jv *eval(rctx *c, frame *f, const node *x);
static void exec_body(rctx *c, frame *f, const nlist *body);

static jv *lookup(rctx *c, frame *f, const char *name, size_t n) {
    for (; f; f = f->parent) { jv **r = dget(&f->vars, name, n); if (r) return *r; }
    for (int b = 0; b < B_COUNT; b++) if (strlen(builtin_names[b]) == n && !memcmp(builtin_names[b], name, n)) { jv *v = vnew(c, V_BUILTIN); v->builtin = b; return v; }
    return vundef(c, "'%.*s' is undefined", (int)n, name);
}

static jargs eval_args(rctx *c, frame *f, const node *x) {
    jargs a = {0};
    a.np = x->args.n; a.nk = x->kwnames.n;
    a.pos = ralloc(c, (a.np + 1) * sizeof *a.pos);
    for (size_t i = 0; i < a.np; i++) a.pos[i] = eval(c, f, x->args.v[i]);
    a.kn = (const node *const *)x->kwnames.v;
    a.kv = ralloc(c, (a.nk + 1) * sizeof *a.kv);
    for (size_t i = 0; i < a.nk; i++) a.kv[i] = eval(c, f, x->kwvals.v[i]);
    return a;
}

/* A macro sees its parameters, then the template's variables; a call block's caller() sees the
 * scope of its {% call %} (its closure). caller: the caller() a {% call %} passes, or NULL. */
static jv *call_macro(rctx *c, int line, const jv *fn, const jargs *a, jv *caller) {
    const node *m = fn->mc.node;
    if (a->np > m->args.n) rfail(c, line, PLN_JINJA_ERROR, "macro '%s' takes not more than %zu argument(s)", m->s, m->args.n);
    if (++c->depth > c->lim.max_depth) rfail(c, line, PLN_JINJA_LIMIT, "macro calls nested deeper than %d (the sandbox's bound)", c->lim.max_depth);
    /* frames live in the arena: a caller() made here may be called after this C frame returns */
    frame *frp = ralloc(c, sizeof *frp);
    frp->parent = fn->mc.closure ? fn->mc.closure : c->root;
    if (caller) dset(c, &frp->vars, "caller", 6, caller);
    for (size_t k = 0; k < a->nk; k++) {
        bool found = false;
        for (size_t i = 0; i < m->args.n; i++) if (!strcmp(m->args.v[i]->s, a->kn[k]->s)) { found = true; if (i < a->np) rfail(c, line, PLN_JINJA_ERROR, "macro '%s' got multiple values for argument '%s'", m->s, a->kn[k]->s); }
        if (!found) rfail(c, line, PLN_JINJA_ERROR, "macro '%s' takes no keyword argument '%s'", m->s, a->kn[k]->s);
    }
    for (size_t i = 0; i < m->args.n; i++) {
        const node *pa = m->args.v[i];
        jv *v = i < a->np ? a->pos[i] : NULL;
        for (size_t k = 0; !v && k < a->nk; k++) if (!strcmp(pa->s, a->kn[k]->s)) v = a->kv[k];
        if (!v) v = pa->a ? eval(c, frp, pa->a) : vundef(c, "parameter '%s' was not provided", pa->s);
        dset(c, &frp->vars, pa->s, pa->sn, v);
    }
    /* captures live in the arena, so an error's longjmp leaves nothing to free */
    obuf *mine = ralloc(c, sizeof *mine), *saved = c->out;
    mine->in_arena = true;
    c->out = mine;
    exec_body(c, frp, &m->body);
    c->out = saved;
    c->ctl = 0;
    c->depth--;
    jv *r = vnew(c, V_STR);
    r->s.s = mine->p ? mine->p : ""; r->s.n = mine->n;
    return r;
}

static jv *call_value(rctx *c, int line, jv *fn, const jargs *a) {
    switch (fn->t) {
    case V_BUILTIN: return call_builtin(c, line, fn->builtin, a);
    case V_MACRO: return call_macro(c, line, fn, a, NULL);
    case V_METHOD: return call_method(c, line, fn->m.self, fn->m.name, a);
    case V_UNDEF: undef_fail(c, line, fn);
    default: rfail(c, line, PLN_JINJA_ERROR, "'%s' object is not callable", type_name(fn));
    }
}

static jv *arith(rctx *c, int line, const char *op, jv *a, jv *b) {
    if (a->t == V_UNDEF) undef_fail(c, line, a);
    if (b->t == V_UNDEF) undef_fail(c, line, b);
    char o0 = op[0], o1 = op[1];
    if (o0 == '+' && a->t == V_STR && b->t == V_STR) {
        sbuf s = {0}; sb_put(c, &s, a->s.s, a->s.n); sb_put(c, &s, b->s.s, b->s.n);
        jv *r = sb_val(c, &s); if (!r->s.s) r->s.s = ""; return r;
    }
    if (o0 == '+' && a->t == V_LIST && b->t == V_LIST && a->tuple == b->tuple) {
        jv *r = vlist(c); r->tuple = a->tuple;
        for (size_t i = 0; i < a->l.n; i++) lpush(c, &r->l, a->l.v[i]);
        for (size_t i = 0; i < b->l.n; i++) lpush(c, &r->l, b->l.v[i]);
        return r;
    }
    if (o0 == '*' && !o1 && ((a->t == V_STR || a->t == V_LIST) && (b->t == V_INT || b->t == V_BOOL))) {
        int64_t k = numi(b);
        if (k > 0 && (a->t == V_STR ? a->s.n : a->l.n) * (uint64_t)k > c->lim.max_output) rfail(c, line, PLN_JINJA_LIMIT, "repetition too large for the sandbox");
        if (a->t == V_STR) { sbuf s = {0}; for (int64_t i = 0; i < k; i++) sb_put(c, &s, a->s.s, a->s.n); jv *r = sb_val(c, &s); if (!r->s.s) r->s.s = ""; return r; }
        jv *r = vlist(c); for (int64_t i = 0; i < k; i++) for (size_t j = 0; j < a->l.n; j++) lpush(c, &r->l, a->l.v[j]);
        return r;
    }
    if (o0 == '*' && !o1 && (b->t == V_STR || b->t == V_LIST) && (a->t == V_INT || a->t == V_BOOL)) return arith(c, line, op, b, a);
    if (o0 == '%' && a->t == V_STR) rfail(c, line, PLN_JINJA_ERROR, "string formatting with %% is not supported by pollen's Jinja");
    if (!is_num(a) || !is_num(b))
        rfail(c, line, PLN_JINJA_ERROR, "unsupported operand type(s) for %s: '%s' and '%s'", op, type_name(a), type_name(b));
    bool fl = a->t == V_FLOAT || b->t == V_FLOAT;
    if (o0 == '/' && !o1) {
        if (numf(b) == 0) rfail(c, line, PLN_JINJA_ERROR, "division by zero");
        return vfloat(c, numf(a) / numf(b));
    }
    if (fl) {
        double x = numf(a), y = numf(b);
        switch (o0) {
        case '+': return vfloat(c, x + y);
        case '-': return vfloat(c, x - y);
        case '*': if (o1 == '*') return vfloat(c, pow(x, y)); return vfloat(c, x * y);
        case '/': if (y == 0) rfail(c, line, PLN_JINJA_ERROR, "float floor division by zero"); return vfloat(c, floor(x / y));
        case '%': { if (y == 0) rfail(c, line, PLN_JINJA_ERROR, "float modulo"); double m = fmod(x, y); if (m && ((m < 0) != (y < 0))) m += y; return vfloat(c, m); }
        }
    }
    int64_t x = numi(a), y = numi(b), r;
    switch (o0) {
    case '+':
        if (__builtin_add_overflow(x, y, &r)) break;
        return vint(c, r);
    case '-':
        if (__builtin_sub_overflow(x, y, &r)) break;
        return vint(c, r);
    case '*':
        if (o1 == '*') {
            if (y < 0) return vfloat(c, pow((double)x, (double)y));
            r = 1;
            for (int64_t i = 0; i < y; i++) if (__builtin_mul_overflow(r, x, &r)) rfail(c, line, PLN_JINJA_ERROR, "integer overflow in **");
            return vint(c, r);
        }
        if (__builtin_mul_overflow(x, y, &r)) break;
        return vint(c, r);
    case '/': case '%': {
        if (!y) rfail(c, line, PLN_JINJA_ERROR, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) break;
        int64_t q = x / y, m = x % y;
        if (m && ((m < 0) != (y < 0))) { q--; m += y; }
        return vint(c, o0 == '/' ? q : m);
    }
    }
    rfail(c, line, PLN_JINJA_ERROR, "integer overflow in %s (pollen's Jinja keeps integers to 64 bits)", op);
}

static jv *eval(rctx *c, frame *f, const node *x) {
    switch (x->t) {
    case E_LIT: return x->lit;
    case E_NAME: return lookup(c, f, x->s, x->sn);
    case E_ATTR: return getattr_v(c, x->line, eval(c, f, x->a), x->s, x->sn);
    case E_ITEM: { jv *o = eval(c, f, x->a); return getitem_v(c, x->line, o, eval(c, f, x->b)); }
    case E_SLICE: {
        jv *o = eval(c, f, x->a);
        return slice_v(c, x->line, o, x->b ? eval(c, f, x->b) : NULL, x->c ? eval(c, f, x->c) : NULL, x->d ? eval(c, f, x->d) : NULL);
    }
    case E_CALL: {
        jv *fn = eval(c, f, x->a);
        jargs a = eval_args(c, f, x);
        return call_value(c, x->line, fn, &a);
    }
    case E_FILTER: {
        jv *v = eval(c, f, x->a);
        jargs a = eval_args(c, f, x);
        return apply_filter(c, x->line, x->s, v, &a);
    }
    case E_TEST: {
        jv *v = eval(c, f, x->a);
        jargs a = eval_args(c, f, x);
        return vbool(apply_test(c, x->line, x->s, v, &a) != x->neg);
    }
    case E_NEG: case E_POS: {
        jv *v = eval(c, f, x->a);
        if (v->t == V_UNDEF) undef_fail(c, x->line, v);
        if (!is_num(v)) rfail(c, x->line, PLN_JINJA_ERROR, "bad operand type for unary %c: '%s'", x->t == E_NEG ? '-' : '+', type_name(v));
        if (x->t == E_POS) return v->t == V_BOOL ? vint(c, v->b) : v;
        if (v->t == V_FLOAT) return vfloat(c, -v->f);
        if (numi(v) == INT64_MIN) rfail(c, x->line, PLN_JINJA_ERROR, "integer overflow in unary -");
        return vint(c, -numi(v));
    }
    case E_NOT: { jv *v = eval(c, f, x->a); if (v->t == V_UNDEF && v->unsafe) undef_fail(c, x->line, v); return vbool(!truthy(v)); }
    case E_AND: { jv *a = eval(c, f, x->a); if (a->unsafe) undef_fail(c, x->line, a); return truthy(a) ? eval(c, f, x->b) : a; }
    case E_OR: { jv *a = eval(c, f, x->a); if (a->unsafe) undef_fail(c, x->line, a); return truthy(a) ? a : eval(c, f, x->b); }
    case E_COND: {
        jv *cond = eval(c, f, x->b);
        if (truthy(cond)) return eval(c, f, x->a);
        return x->c ? eval(c, f, x->c) : vundef(c, "the inline if expression on line %d evaluated to false and no else section was defined", x->line);
    }
    case E_BIN: {
        jv *a = eval(c, f, x->a), *b = eval(c, f, x->b);
        if (x->s[0] == '~') {
            if (a->unsafe) undef_fail(c, x->line, a);
            if (b->unsafe) undef_fail(c, x->line, b);
            sbuf s = {0}; str_into(c, &s, a); str_into(c, &s, b); jv *r = sb_val(c, &s); if (!r->s.s) r->s.s = ""; return r;
        }
        return arith(c, x->line, x->s, a, b);
    }
    case E_CMP: {
        jv *l = eval(c, f, x->args.v[0]);
        for (size_t i = 1; i < x->args.n; i++) {
            jv *r = eval(c, f, x->args.v[i]);
            const char *op = x->kwnames.v[i - 1]->s;
            bool ok;
            if (l->unsafe) undef_fail(c, x->line, l);
            if (r->unsafe) undef_fail(c, x->line, r);
            if (!strcmp(op, "==")) ok = veq(l, r);
            else if (!strcmp(op, "!=")) ok = !veq(l, r);
            else if (!strcmp(op, "in")) ok = vin(c, x->line, l, r);
            else if (!strcmp(op, "notin")) ok = !vin(c, x->line, l, r);
            else {
                int k = vcmp(c, x->line, l, r, op);
                ok = !strcmp(op, "<") ? k < 0 : !strcmp(op, ">") ? k > 0 : !strcmp(op, "<=") ? k <= 0 : k >= 0;
            }
            if (!ok) return &V_FALSE_C;
            l = r;
        }
        return &V_TRUE_C;
    }
    case E_LIST: case E_TUPLE: {
        jv *r = vlist(c); r->tuple = x->t == E_TUPLE;
        for (size_t i = 0; i < x->args.n; i++) lpush(c, &r->l, eval(c, f, x->args.v[i]));
        return r;
    }
    case E_DICT: {
        jv *d = vnew(c, V_DICT);
        for (size_t i = 0; i < x->args.n; i++) {
            jv *k = eval(c, f, x->args.v[i]);
            if (k->t == V_LIST && !k->tuple) rfail(c, x->line, PLN_JINJA_ERROR, "unhashable type: 'list'");
            if (k->t == V_DICT) rfail(c, x->line, PLN_JINJA_ERROR, "unhashable type: 'dict'");
            dsetv(c, &d->d, k, eval(c, f, x->kwvals.v[i]));
        }
        return d;
    }
    default: break;
    }
    rfail(c, x->line, PLN_JINJA_ERROR, "internal error: unknown expression node");
}

static void step(rctx *c, int line) {
    if (++c->steps > c->lim.max_steps)
        rfail(c, line, PLN_JINJA_LIMIT, "the template ran more than %" PRIu64 " steps (the sandbox's bound)", c->lim.max_steps);
}

static void assign(rctx *c, frame *f, const nlist *targets, jv *v, int line) {
    if (targets->n == 1) {
        const node *t = targets->v[0];
        if (t->t == E_NAME) { dset(c, &f->vars, t->s, t->sn, v); return; }
        jv *ns = lookup(c, f, t->a->s, t->a->sn);
        if (ns->t != V_NS) rfail(c, line, PLN_JINJA_ERROR, "cannot assign attribute on non-namespace object ('%s' is %s)", t->a->s, type_name(ns));
        dset(c, &ns->d, t->s, t->sn, v);
        return;
    }
    jlist it = iter_items(c, line, v);
    if (it.n != targets->n) rfail(c, line, PLN_JINJA_ERROR, "cannot unpack %zu values into %zu names", it.n, targets->n);
    for (size_t i = 0; i < it.n; i++) { nlist one = {.v = (node **)&targets->v[i], .n = 1}; assign(c, f, &one, it.v[i], line); }
}

static void exec_node(rctx *c, frame *f, const node *x) {
    step(c, x->line);
    switch (x->t) {
    case N_TEXT: out_put(c, x->line, x->s, x->sn); return;
    case N_OUT: {
        jv *v = eval(c, f, x->a);
        if (v->t == V_UNDEF) { if (v->unsafe) undef_fail(c, x->line, v); return; }
        sbuf b = {0}; str_into(c, &b, v);
        out_put(c, x->line, b.p ? b.p : "", b.n);
        return;
    }
    case N_IF:
        for (size_t i = 0; i < x->args.n; i++) {
            jv *cond = eval(c, f, x->args.v[i]->a);
            if (cond->unsafe) undef_fail(c, x->line, cond);
            if (truthy(cond)) { exec_body(c, f, &x->args.v[i]->body); return; }
        }
        exec_body(c, f, &x->orelse);
        return;
    case N_FOR: {
        jv *it = eval(c, f, x->a);
        jlist items = iter_items(c, x->line, it);
        if (x->b) {   /* the loop filter sees each item under the target names */
            jlist kept = {0};
            for (size_t i = 0; i < items.n; i++) {
                step(c, x->line);
                frame *tf = ralloc(c, sizeof *tf);
                tf->parent = f;
                assign(c, tf, &x->targets, items.v[i], x->line);
                if (truthy(eval(c, tf, x->b))) lpush(c, &kept, items.v[i]);
            }
            items = kept;
        }
        if (!items.n) { exec_body(c, f, &x->orelse); return; }
        loopst *L = ralloc(c, sizeof *L);
        L->items = items;
        jv *lv = vnew(c, V_LOOP); lv->loop = L;
        for (size_t i = 0; i < items.n; i++) {
            step(c, x->line);
            L->idx = i;
            frame *it_f = ralloc(c, sizeof *it_f);   /* arena: a caller() made in the body may outlive it */
            it_f->parent = f;
            dset(c, &it_f->vars, "loop", 4, lv);
            assign(c, it_f, &x->targets, items.v[i], x->line);
            exec_body(c, it_f, &x->body);
            if (c->ctl == 1) { c->ctl = 0; break; }
            c->ctl = 0;
        }
        return;
    }
    case N_SET: assign(c, f, &x->targets, eval(c, f, x->a), x->line); return;
    case N_SETBLOCK: case N_FILTERBLOCK: {
        obuf *mine = ralloc(c, sizeof *mine), *saved = c->out;
        mine->in_arena = true;
        c->out = mine;
        exec_body(c, f, &x->body);
        c->out = saved;
        jv *v = vnew(c, V_STR);
        v->s.s = mine->p ? mine->p : ""; v->s.n = mine->n;
        for (size_t i = 0; i < x->args.n; i++) {
            const node *fl = x->args.v[i];
            jargs a = eval_args(c, f, fl);
            v = apply_filter(c, fl->line, fl->s, v, &a);
        }
        if (x->t == N_SETBLOCK) { assign(c, f, &x->targets, v, x->line); return; }
        if (v->t == V_UNDEF) { if (v->unsafe) undef_fail(c, x->line, v); return; }
        sbuf b = {0}; str_into(c, &b, v);
        out_put(c, x->line, b.p ? b.p : "", b.n);
        return;
    }
    case N_MACRO: { jv *m = vnew(c, V_MACRO); m->mc.node = x; dset(c, &f->vars, x->s, x->sn, m); return; }
    case N_CALLBLOCK: {
        jv *fn = eval(c, f, x->a->a);
        if (fn->t == V_UNDEF) undef_fail(c, x->line, fn);
        if (fn->t != V_MACRO) rfail(c, x->line, PLN_JINJA_ERROR, "{%% call %%} needs a macro, not %s", type_name(fn));
        jargs a = eval_args(c, f, x->a);
        jv *caller = vnew(c, V_MACRO);
        caller->mc.node = x;
        caller->mc.closure = f;
        jv *r = call_macro(c, x->line, fn, &a, caller);
        out_put(c, x->line, r->s.s, r->s.n);
        return;
    }
    case N_BREAK: c->ctl = 1; return;
    case N_CONTINUE: c->ctl = 2; return;
    case N_BLOCK: exec_body(c, f, &x->body); return;
    default: rfail(c, x->line, PLN_JINJA_ERROR, "internal error: unknown statement node");
    }
}

static void exec_body(rctx *c, frame *f, const nlist *body) {
    for (size_t i = 0; i < body->n && !c->ctl; i++) exec_node(c, f, body->v[i]);
}

pln_jinja_status pln_jinja_render(const pln_jinja *t, json_t *vars, const pln_jinja_limits *lim,
                                  char **out, size_t *out_len) {
    *out = NULL; if (out_len) *out_len = 0;
    rctx *c = calloc(1, sizeof *c);
    if (!c) pln_die("out of memory");
    c->t = t;
    if (lim) c->lim = *lim; else pln_jinja_limits_default(&c->lim);
    c->ar.limit = c->lim.max_memory;
    obuf main_out = {0};
    c->out = &main_out;
    frame root = {0};
    c->root = &root;
    if (setjmp(c->jb)) {
        free(main_out.p);
        pln_jinja_status st = c->status;
        pln_errorf("%s", c->err);
        arena_free(&c->ar);
        free(c);
        return st;
    }
    if (vars && json_is_object(vars)) {
        const char *k; json_t *e;
        json_object_foreach(vars, k, e) dset(c, &root.vars, k, strlen(k), from_json(c, e));
    }
    exec_body(c, &root, &t->body);
    arena_free(&c->ar);
    free(c);
    if (!main_out.p) main_out.p = pln_xstrdup("");
    *out = main_out.p;
    if (out_len) *out_len = main_out.n;
    return PLN_JINJA_OK;
}

char *pln_jinja_tojson(json_t *v, int indent) {
    rctx *c = calloc(1, sizeof *c);
    if (!c) pln_die("out of memory");
    pln_jinja_limits_default(&c->lim);
    c->ar.limit = c->lim.max_memory;
    char *r;
    if (setjmp(c->jb)) { r = pln_xstrdup("null"); }
    else {
        sbuf b = {0};
        json_dump(c, 0, &b, from_json(c, v), indent, 0, indent >= 0 ? "," : ", ", ": ");
        r = pln_xstrdup(b.p ? b.p : "");
    }
    arena_free(&c->ar);
    free(c);
    return r;
}
