/* torchzip.c — PyTorch zip checkpoints (torch.save >= 1.6) and a safe, non-executing unpickler
 * for the state dicts in them (layout and rules in torchzip.h). */
#include "formats/torchzip.h"

#include <archive.h>
#include <archive_entry.h>
#include <stdlib.h>
#include <string.h>

/* =========================================================================================
 * The safe unpickler. Objects live in an arena freed at the end; only the values a state dict
 * can hold exist (None, bool, int, float, str/bytes, tuple, list, dict, allowlisted globals,
 * storages from persistent ids, tensors). No code path calls anything named by the pickle: an
 * allowlisted global maps to one of a fixed set of C constructors below.
 * ========================================================================================= */

typedef enum { V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_TUPLE, V_LIST, V_DICT, V_GLOBAL, V_STORAGE, V_TENSOR } vkind;

typedef enum {
    G_ORDERED_DICT, G_REBUILD_V1, G_REBUILD_V2, G_REBUILD_V3, G_REBUILD_PARAM, G_REBUILD_PARAM_STATE,
    G_REBUILD_FROM_TYPE_V2, G_TENSOR_CLASS, G_PARAMETER_CLASS, G_STORAGE_TYPE, G_UNTYPED_STORAGE, G_DTYPE,
} gkind;

typedef struct val {
    vkind kind;
    int64_t i;                   /* INT, BOOL; TENSOR: index into tensors; GLOBAL: gkind */
    double f;
    char *s;                     /* STR (owned, NUL-terminated); STORAGE: key */
    size_t slen;
    struct val **items;          /* TUPLE/LIST items; DICT: key, value, key, value, ... */
    size_t n, cap;
    pln_dtype dt;                /* GLOBAL storage type / dtype; STORAGE */
    bool untyped;                /* STORAGE / GLOBAL from torch.UntypedStorage: numel counts bytes */
    int64_t numel;               /* STORAGE */
} val;

typedef struct {
    const char *where;
    const uint8_t *p, *end, *base;
    val **arena; size_t n_arena, cap_arena;
    val **stack; size_t sp, cap_stack;
    size_t *marks; size_t n_marks, cap_marks;
    val **memo; size_t n_memo, cap_memo;
    pln_pickle_tensor *tens; int64_t n_tens, cap_tens;
} unpickler;

#define MAX_MEMO (1u << 24)

static int uerr(unpickler *u, const char *fmt, const char *a) {
    char msg[640];
    snprintf(msg, sizeof msg, fmt, a ? a : "");
    return pln_errorf("%s: pickle offset %lld: %s", u->where, (long long)(u->p - u->base), msg);
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    *cap = c;
    return pln_xrealloc(p, c * elem);
}

static val *newv(unpickler *u, vkind k) {
    val *v = pln_xcalloc(1, sizeof *v);
    v->kind = k;
    u->arena = grow(u->arena, &u->cap_arena, u->n_arena + 1, sizeof *u->arena);
    u->arena[u->n_arena++] = v;
    return v;
}

static void push(unpickler *u, val *v) {
    u->stack = grow(u->stack, &u->cap_stack, u->sp + 1, sizeof *u->stack);
    u->stack[u->sp++] = v;
}

static size_t floor_mark(unpickler *u) { return u->n_marks ? u->marks[u->n_marks - 1] : 0; }

static val *pop(unpickler *u) {
    if (u->sp <= floor_mark(u)) { uerr(u, "stack underflow (corrupt pickle)", NULL); return NULL; }
    return u->stack[--u->sp];
}

static val *top(unpickler *u) {
    if (u->sp <= floor_mark(u)) { uerr(u, "stack underflow (corrupt pickle)", NULL); return NULL; }
    return u->stack[u->sp - 1];
}

static void add_item(val *c, val *x) {
    c->items = grow(c->items, &c->cap, c->n + 1, sizeof *c->items);
    c->items[c->n++] = x;
}

/* Pops everything above the last MARK into a new container of kind k (TUPLE/LIST), or NULL. */
static int pop_mark(unpickler *u, size_t *from) {
    if (!u->n_marks) return uerr(u, "no MARK on the stack (corrupt pickle)", NULL);
    *from = u->marks[--u->n_marks];
    return 0;
}

static bool need(unpickler *u, size_t n) { return (size_t)(u->end - u->p) >= n; }

static uint64_t rd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static bool utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        int len; uint32_t cp;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
        else return false;
        if (i + (size_t)len > n) return false;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += (size_t)len;
    }
    return true;
}

static val *mkstr(unpickler *u, const uint8_t *s, size_t n) {
    val *v = newv(u, V_STR);
    v->s = pln_xmalloc(n + 1);
    memcpy(v->s, s, n);
    v->s[n] = 0;
    v->slen = n;
    return v;
}

static const struct { const char *name; pln_dtype dt; } g_storage_types[] = {
    {"FloatStorage", PLN_DTYPE_F32}, {"HalfStorage", PLN_DTYPE_F16}, {"BFloat16Storage", PLN_DTYPE_BF16},
    {"DoubleStorage", PLN_DTYPE_F64}, {"LongStorage", PLN_DTYPE_I64}, {"IntStorage", PLN_DTYPE_I32},
    {"ShortStorage", PLN_DTYPE_I16}, {"CharStorage", PLN_DTYPE_I8}, {"ByteStorage", PLN_DTYPE_U8},
    {"BoolStorage", PLN_DTYPE_BOOL},
};
static const struct { const char *name; pln_dtype dt; } g_dtypes[] = {
    {"float32", PLN_DTYPE_F32}, {"float", PLN_DTYPE_F32}, {"float16", PLN_DTYPE_F16}, {"half", PLN_DTYPE_F16},
    {"bfloat16", PLN_DTYPE_BF16}, {"float64", PLN_DTYPE_F64}, {"double", PLN_DTYPE_F64},
    {"int64", PLN_DTYPE_I64}, {"long", PLN_DTYPE_I64}, {"int32", PLN_DTYPE_I32}, {"int", PLN_DTYPE_I32},
    {"int16", PLN_DTYPE_I16}, {"short", PLN_DTYPE_I16}, {"int8", PLN_DTYPE_I8}, {"uint8", PLN_DTYPE_U8},
    {"bool", PLN_DTYPE_BOOL},
};

/* The allowlist. Anything else is refused by name, before any use. */
static int resolve_global(unpickler *u, const char *mod, const char *name) {
    val *g = newv(u, V_GLOBAL);
    g->i = -1;
    if (!strcmp(mod, "collections") && !strcmp(name, "OrderedDict")) g->i = G_ORDERED_DICT;
    else if (!strcmp(mod, "torch._utils")) {
        if (!strcmp(name, "_rebuild_tensor")) g->i = G_REBUILD_V1;
        else if (!strcmp(name, "_rebuild_tensor_v2")) g->i = G_REBUILD_V2;
        else if (!strcmp(name, "_rebuild_tensor_v3")) g->i = G_REBUILD_V3;
        else if (!strcmp(name, "_rebuild_parameter")) g->i = G_REBUILD_PARAM;
        else if (!strcmp(name, "_rebuild_parameter_with_state")) g->i = G_REBUILD_PARAM_STATE;
    } else if (!strcmp(mod, "torch._tensor") && !strcmp(name, "_rebuild_from_type_v2")) g->i = G_REBUILD_FROM_TYPE_V2;
    else if (!strcmp(mod, "torch") && !strcmp(name, "Tensor")) g->i = G_TENSOR_CLASS;
    else if ((!strcmp(mod, "torch.nn.parameter") || !strcmp(mod, "torch.nn")) && !strcmp(name, "Parameter"))
        g->i = G_PARAMETER_CLASS;
    else if (!strcmp(mod, "torch") || !strcmp(mod, "torch.storage")) {
        if (!strcmp(name, "UntypedStorage")) { g->i = G_UNTYPED_STORAGE; g->dt = PLN_DTYPE_U8; g->untyped = true; }
        for (size_t k = 0; k < sizeof g_storage_types / sizeof g_storage_types[0] && g->i < 0; k++)
            if (!strcmp(name, g_storage_types[k].name)) { g->i = G_STORAGE_TYPE; g->dt = g_storage_types[k].dt; }
        for (size_t k = 0; k < sizeof g_dtypes / sizeof g_dtypes[0] && g->i < 0 && !strcmp(mod, "torch"); k++)
            if (!strcmp(name, g_dtypes[k].name)) { g->i = G_DTYPE; g->dt = g_dtypes[k].dt; }
    }
    if (g->i < 0) {
        char full[300];
        snprintf(full, sizeof full, "%.140s.%.140s", mod, name);
        return uerr(u, "global %s is not allowed in a weights file (only tensors, storages and OrderedDict "
                       "may appear); refusing to load it, nothing was executed", full);
    }
    push(u, g);
    return 0;
}

static bool is_int(const val *v) { return v && (v->kind == V_INT || v->kind == V_BOOL); }

static int int_tuple(unpickler *u, const val *v, const char *what, int64_t *out, int *n) {
    if (!v || (v->kind != V_TUPLE && v->kind != V_LIST)) return uerr(u, "tensor %s is not a tuple", what);
    if (v->n > PLN_MAX_DIMS) return uerr(u, "tensor %s has more dimensions than the 8 supported", what);
    for (size_t k = 0; k < v->n; k++) {
        if (!is_int(v->items[k]) || v->items[k]->i < 0) return uerr(u, "tensor %s holds a non-integer or negative value", what);
        out[k] = v->items[k]->i;
    }
    *n = (int)v->n;
    return 0;
}

/* _rebuild_tensor{,_v2,_v3}(storage, storage_offset, size, stride, ...) -> a tensor value. */
static val *rebuild_tensor(unpickler *u, int kind, val *args) {
    size_t want = kind == G_REBUILD_V1 ? 4 : kind == G_REBUILD_V2 ? 6 : 7;
    if (args->kind != V_TUPLE || args->n < want) { uerr(u, "tensor rebuild call with too few arguments", NULL); return NULL; }
    val *st = args->items[0], *off = args->items[1];
    if (st->kind != V_STORAGE) { uerr(u, "tensor rebuild call whose first argument is not a storage", NULL); return NULL; }
    if (!is_int(off) || off->i < 0) { uerr(u, "tensor storage offset is not a non-negative integer", NULL); return NULL; }
    pln_pickle_tensor t = {0};
    if (int_tuple(u, args->items[2], "size", t.shape, &t.ndim)) return NULL;
    int nd2;
    if (int_tuple(u, args->items[3], "stride", t.stride, &nd2)) return NULL;
    if (nd2 != t.ndim) { uerr(u, "tensor size and stride have different lengths", NULL); return NULL; }
    t.dtype = st->dt;
    t.storage_numel = st->numel;
    if (kind == G_REBUILD_V3) {
        val *dt = args->items[6];
        if (dt->kind != V_GLOBAL || dt->i != G_DTYPE) { uerr(u, "_rebuild_tensor_v3 dtype argument is not a torch dtype", NULL); return NULL; }
        t.dtype = dt->dt;
    }
    if (st->untyped) t.storage_numel = st->numel / (int64_t)pln_dtype_size(t.dtype);
    else if (kind == G_REBUILD_V3 && t.dtype != st->dt) { uerr(u, "_rebuild_tensor_v3 dtype differs from its typed storage", NULL); return NULL; }
    t.storage_offset = off->i;
    t.storage_key = pln_xstrdup(st->s);
    u->tens = grow(u->tens, (size_t *)&u->cap_tens, (size_t)u->n_tens + 1, sizeof *u->tens);
    u->tens[u->n_tens] = t;
    val *v = newv(u, V_TENSOR);
    v->i = u->n_tens++;
    return v;
}

/* REDUCE / NEWOBJ of an allowlisted callable. */
static val *call(unpickler *u, val *fn, val *args, bool newobj) {
    if (fn->kind != V_GLOBAL) { uerr(u, "REDUCE on something that is not an allowed global", NULL); return NULL; }
    if (args->kind != V_TUPLE) { uerr(u, "REDUCE arguments are not a tuple", NULL); return NULL; }
    switch ((gkind)fn->i) {
    case G_ORDERED_DICT: {
        val *d = newv(u, V_DICT);
        if (args->n == 0) return d;
        /* OrderedDict([(k, v), ...]) */
        val *l = args->items[0];
        if (args->n != 1 || (l->kind != V_LIST && l->kind != V_TUPLE)) { uerr(u, "unsupported OrderedDict arguments", NULL); return NULL; }
        for (size_t k = 0; k < l->n; k++) {
            val *pr = l->items[k];
            if ((pr->kind != V_TUPLE && pr->kind != V_LIST) || pr->n != 2) { uerr(u, "OrderedDict item is not a pair", NULL); return NULL; }
            add_item(d, pr->items[0]);
            add_item(d, pr->items[1]);
        }
        return d;
    }
    case G_REBUILD_V1: case G_REBUILD_V2: case G_REBUILD_V3:
        if (newobj) break;
        return rebuild_tensor(u, (int)fn->i, args);
    case G_REBUILD_PARAM: case G_REBUILD_PARAM_STATE:
        if (newobj) break;
        if (args->n < 1 || args->items[0]->kind != V_TENSOR) { uerr(u, "_rebuild_parameter of something that is not a tensor", NULL); return NULL; }
        return args->items[0];
    case G_REBUILD_FROM_TYPE_V2: {
        /* _rebuild_from_type_v2(func, new_type, args, state): func(*args), new_type Tensor/Parameter.
         * func may not be _rebuild_from_type_v2 itself: that keeps this recursion one level deep. */
        if (newobj) break;
        if (args->n < 3 || args->items[0]->kind != V_GLOBAL || args->items[1]->kind != V_GLOBAL ||
            args->items[0]->i == G_REBUILD_FROM_TYPE_V2 ||
            (args->items[1]->i != G_TENSOR_CLASS && args->items[1]->i != G_PARAMETER_CLASS)) {
            uerr(u, "unsupported _rebuild_from_type_v2 arguments", NULL);
            return NULL;
        }
        return call(u, args->items[0], args->items[2], false);
    }
    default: break;
    }
    uerr(u, "an allowed global was called in an unsupported way", NULL);
    return NULL;
}

static void free_unpickler(unpickler *u) {
    for (size_t k = 0; k < u->n_arena; k++) { free(u->arena[k]->s); free(u->arena[k]->items); free(u->arena[k]); }
    free(u->arena);
    free(u->stack);
    free(u->marks);
    free(u->memo);
}

void pln_pickle_tensors_free(pln_pickle_tensor *t, int64_t n) {
    if (!t) return;
    for (int64_t i = 0; i < n; i++) { free(t[i].name); free(t[i].storage_key); }
    free(t);
}

static int memo_put(unpickler *u, uint64_t idx) {
    val *v = top(u);
    if (!v) return -1;
    /* Picklers number memo slots 0, 1, 2, ...; a far jump is corruption, not a reason to allocate. */
    if (idx >= MAX_MEMO || idx > u->n_memo + 4096) return uerr(u, "memo index out of range (corrupt pickle)", NULL);
    if (idx >= u->n_memo) {
        u->memo = grow(u->memo, &u->cap_memo, (size_t)idx + 1, sizeof *u->memo);
        memset(u->memo + u->n_memo, 0, ((size_t)idx + 1 - u->n_memo) * sizeof *u->memo);
        u->n_memo = (size_t)idx + 1;
    }
    u->memo[idx] = v;
    return 0;
}

static int memo_get(unpickler *u, uint64_t idx) {
    if (idx >= u->n_memo || !u->memo[idx]) return uerr(u, "memo lookup of a missing entry (corrupt pickle)", NULL);
    push(u, u->memo[idx]);
    return 0;
}

static int run(unpickler *u, val **result) {
    while (u->p < u->end) {
        uint8_t op = *u->p;
        const uint8_t *at = u->p;
        u->p++;
        val *a, *b, *c;
        size_t from = 0;
        switch (op) {
        case 0x80: /* PROTO */
            if (!need(u, 1)) goto trunc;
            if (*u->p > 5) { u->p = at; return uerr(u, "pickle protocol above 5", NULL); }
            u->p++;
            break;
        case 0x95: /* FRAME: a length hint only */
            if (!need(u, 8)) goto trunc;
            u->p += 8;
            break;
        case '}': push(u, newv(u, V_DICT)); break;
        case ']': push(u, newv(u, V_LIST)); break;
        case ')': push(u, newv(u, V_TUPLE)); break;
        case 'N': push(u, newv(u, V_NONE)); break;
        case 0x88: case 0x89: a = newv(u, V_BOOL); a->i = op == 0x88; push(u, a); break;
        case '(':
            u->marks = grow(u->marks, &u->cap_marks, u->n_marks + 1, sizeof *u->marks);
            u->marks[u->n_marks++] = u->sp;
            break;
        case 't': case 'l': /* TUPLE, LIST */
            if (pop_mark(u, &from)) return -1;
            a = newv(u, op == 't' ? V_TUPLE : V_LIST);
            for (size_t k = from; k < u->sp; k++) add_item(a, u->stack[k]);
            u->sp = from;
            push(u, a);
            break;
        case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
            size_t n = (size_t)(op - 0x84);
            if (u->sp < floor_mark(u) + n) return uerr(u, "stack underflow (corrupt pickle)", NULL);
            a = newv(u, V_TUPLE);
            for (size_t k = u->sp - n; k < u->sp; k++) add_item(a, u->stack[k]);
            u->sp -= n;
            push(u, a);
            break;
        }
        case 'q': if (!need(u, 1)) goto trunc; if (memo_put(u, u->p[0])) return -1; u->p += 1; break;
        case 'r': if (!need(u, 4)) goto trunc; if (memo_put(u, rd_le(u->p, 4))) return -1; u->p += 4; break;
        case 0x94: if (memo_put(u, u->n_memo)) return -1; break;   /* MEMOIZE */
        case 'h': if (!need(u, 1)) goto trunc; if (memo_get(u, u->p[0])) return -1; u->p += 1; break;
        case 'j': if (!need(u, 4)) goto trunc; if (memo_get(u, rd_le(u->p, 4))) return -1; u->p += 4; break;
        case 'K': if (!need(u, 1)) goto trunc; a = newv(u, V_INT); a->i = u->p[0]; u->p += 1; push(u, a); break;
        case 'M': if (!need(u, 2)) goto trunc; a = newv(u, V_INT); a->i = (int64_t)rd_le(u->p, 2); u->p += 2; push(u, a); break;
        case 'J': if (!need(u, 4)) goto trunc; a = newv(u, V_INT); a->i = (int32_t)(uint32_t)rd_le(u->p, 4); u->p += 4; push(u, a); break;
        case 0x8a: { /* LONG1: n-byte little-endian two's complement */
            if (!need(u, 1)) goto trunc;
            size_t n = u->p[0];
            if (n > 8) return uerr(u, "integer wider than 64 bits", NULL);
            if (!need(u, 1 + n)) goto trunc;
            uint64_t x = n ? rd_le(u->p + 1, (int)n) : 0;
            if (n && n < 8 && (u->p[n] & 0x80)) x |= ~0ull << (8 * n);
            a = newv(u, V_INT);
            a->i = (int64_t)x;
            u->p += 1 + n;
            push(u, a);
            break;
        }
        case 'G': { /* BINFLOAT, big-endian */
            if (!need(u, 8)) goto trunc;
            uint64_t x = 0;
            for (int k = 0; k < 8; k++) x = x << 8 | u->p[k];
            a = newv(u, V_FLOAT);
            memcpy(&a->f, &x, 8);
            u->p += 8;
            push(u, a);
            break;
        }
        case 'X': case 0x8c: case 0x8d: case 'T': case 'U': case 'B': case 'C': case 0x8e: {
            /* BINUNICODE(4) SHORT_BINUNICODE(1) BINUNICODE8(8) BINSTRING(4) SHORT_BINSTRING(1)
             * BINBYTES(4) SHORT_BINBYTES(1) BINBYTES8(8) */
            int lw = (op == 0x8c || op == 'U' || op == 'C') ? 1 : (op == 0x8d || op == 0x8e) ? 8 : 4;
            if (!need(u, (size_t)lw)) goto trunc;
            uint64_t n = rd_le(u->p, lw);
            if (n > (uint64_t)(u->end - u->p) - (uint64_t)lw) goto trunc;
            u->p += lw;
            push(u, mkstr(u, u->p, (size_t)n));
            u->p += n;
            break;
        }
        case 'c': { /* GLOBAL "module\nname\n" */
            const uint8_t *nl1 = memchr(u->p, '\n', (size_t)(u->end - u->p));
            if (!nl1) goto trunc;
            const uint8_t *nl2 = memchr(nl1 + 1, '\n', (size_t)(u->end - nl1 - 1));
            if (!nl2) goto trunc;
            char mod[160], name[160];
            snprintf(mod, sizeof mod, "%.*s", (int)(nl1 - u->p), (const char *)u->p);
            snprintf(name, sizeof name, "%.*s", (int)(nl2 - nl1 - 1), (const char *)nl1 + 1);
            if (memchr(u->p, 0, (size_t)(nl2 - u->p))) return uerr(u, "NUL byte in a GLOBAL name", NULL);
            u->p = at;
            if (resolve_global(u, mod, name)) return -1;
            u->p = nl2 + 1;
            break;
        }
        case 0x93: /* STACK_GLOBAL */
            if (!(b = pop(u)) || !(a = pop(u))) return -1;
            if (a->kind != V_STR || b->kind != V_STR || memchr(a->s, 0, a->slen) || memchr(b->s, 0, b->slen))
                return uerr(u, "STACK_GLOBAL of non-strings", NULL);
            u->p = at;
            if (resolve_global(u, a->s, b->s)) return -1;
            u->p = at + 1;
            break;
        case 'Q': { /* BINPERSID: ('storage', StorageType, key, location, numel) */
            if (!(a = pop(u))) return -1;
            if (a->kind != V_TUPLE || a->n != 5 || a->items[0]->kind != V_STR || strcmp(a->items[0]->s, "storage"))
                return uerr(u, "persistent id is not ('storage', type, key, location, numel)", NULL);
            val *ty = a->items[1], *key = a->items[2], *loc = a->items[3], *num = a->items[4];
            if (ty->kind != V_GLOBAL || (ty->i != G_STORAGE_TYPE && ty->i != G_UNTYPED_STORAGE))
                return uerr(u, "persistent id storage type is not a torch Storage type", NULL);
            if (key->kind != V_STR || key->slen == 0 || key->slen > 64 || strchr(key->s, '/') || memchr(key->s, 0, key->slen))
                return uerr(u, "persistent id storage key is not a plain name", NULL);
            if (loc->kind != V_STR || !is_int(num) || num->i < 0)
                return uerr(u, "persistent id has a bad location or element count", NULL);
            c = newv(u, V_STORAGE);
            c->s = pln_xstrdup(key->s);
            c->dt = ty->dt;
            c->untyped = ty->untyped;
            c->numel = num->i;
            push(u, c);
            break;
        }
        case 'R': case 0x81: /* REDUCE, NEWOBJ */
            if (!(b = pop(u)) || !(a = pop(u))) return -1;
            if (!(c = call(u, a, b, op == 0x81))) return -1;
            push(u, c);
            break;
        case 'b': /* BUILD: state is inert data (OrderedDict._metadata, Parameter state); drop it */
            if (!(b = pop(u)) || !(a = top(u))) return -1;
            if (a->kind != V_DICT && a->kind != V_TENSOR) return uerr(u, "BUILD on an object that is not a dict or tensor", NULL);
            break;
        case 's': /* SETITEM */
            if (!(c = pop(u)) || !(b = pop(u)) || !(a = top(u))) return -1;
            if (a->kind != V_DICT) return uerr(u, "SETITEM on something that is not a dict", NULL);
            add_item(a, b);
            add_item(a, c);
            break;
        case 'u': /* SETITEMS */
            if (pop_mark(u, &from)) return -1;
            if ((u->sp - from) % 2) return uerr(u, "SETITEMS with an odd number of items", NULL);
            if (u->sp <= floor_mark(u) || from == 0 || from - 1 < floor_mark(u)) return uerr(u, "stack underflow (corrupt pickle)", NULL);
            a = u->stack[from - 1];
            if (a->kind != V_DICT) return uerr(u, "SETITEMS on something that is not a dict", NULL);
            for (size_t k = from; k < u->sp; k++) add_item(a, u->stack[k]);
            u->sp = from;
            break;
        case 'a': /* APPEND */
            if (!(b = pop(u)) || !(a = top(u))) return -1;
            if (a->kind != V_LIST) return uerr(u, "APPEND to something that is not a list", NULL);
            add_item(a, b);
            break;
        case 'e': /* APPENDS */
            if (pop_mark(u, &from)) return -1;
            if (from == 0 || from - 1 < floor_mark(u)) return uerr(u, "stack underflow (corrupt pickle)", NULL);
            a = u->stack[from - 1];
            if (a->kind != V_LIST) return uerr(u, "APPENDS to something that is not a list", NULL);
            for (size_t k = from; k < u->sp; k++) add_item(a, u->stack[k]);
            u->sp = from;
            break;
        case '0': if (!pop(u)) return -1; break;                     /* POP */
        case '1': if (pop_mark(u, &from)) return -1; u->sp = from; break;   /* POP_MARK */
        case '2': if (!(a = top(u))) return -1; push(u, a); break;   /* DUP */
        case '.': /* STOP */
            if (!(a = pop(u))) return -1;
            *result = a;
            return 0;
        default: {
            char what[64];
            snprintf(what, sizeof what, "0x%02x", op);
            u->p = at;
            return uerr(u, "opcode %s is not supported by the safe unpickler (not a plain state dict?)", what);
        }
        }
    }
    return uerr(u, "pickle ends without STOP (truncated?)", NULL);
trunc:
    return uerr(u, "pickle truncated inside an opcode's argument", NULL);
}

static int str_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

int pln_unpickle_state_dict(const uint8_t *pkl, uint64_t n, const char *where, pln_pickle_tensor **out, int64_t *n_out) {
    unpickler u = {.where = where, .p = pkl, .end = pkl + n, .base = pkl};
    val *res = NULL;
    *out = NULL;
    *n_out = 0;
    int rc = run(&u, &res);
    pln_pickle_tensor *ts = NULL;
    int64_t nt = 0;
    if (!rc && res->kind != V_DICT) rc = pln_errorf("%s: the pickle holds no state dict (top-level object is not a dict)", where);
    if (!rc) {
        ts = pln_xcalloc(res->n / 2 + 1, sizeof *ts);
        for (size_t k = 0; k + 1 < res->n && !rc; k += 2) {
            val *key = res->items[k], *v = res->items[k + 1];
            if (key->kind != V_STR || memchr(key->s, 0, key->slen) || !utf8_valid((const uint8_t *)key->s, key->slen)) {
                rc = pln_errorf("%s: state dict key #%zu is not a valid UTF-8 string", where, k / 2);
                break;
            }
            if (v->kind != V_TENSOR) { rc = pln_errorf("%s: state dict entry \"%s\" is not a tensor", where, key->s); break; }
            pln_pickle_tensor *t = &ts[nt++];
            *t = u.tens[v->i];
            t->name = pln_xstrdup(key->s);
            t->storage_key = pln_xstrdup(t->storage_key);
        }
    }
    if (!rc && nt > 1) {   /* names must be unique: sort a copy of the pointers */
        const char **names = pln_xmalloc((size_t)nt * sizeof *names);
        for (int64_t j = 0; j < nt; j++) names[j] = ts[j].name;
        qsort(names, (size_t)nt, sizeof *names, str_cmp);
        for (int64_t j = 1; j < nt && !rc; j++)
            if (!strcmp(names[j], names[j - 1])) rc = pln_errorf("%s: duplicate tensor name \"%s\"", where, names[j]);
        free(names);
    }
    for (int64_t k = 0; k < u.n_tens; k++) free(u.tens[k].storage_key);
    free(u.tens);
    free_unpickler(&u);
    if (rc) { pln_pickle_tensors_free(ts, nt); return -1; }
    *out = ts;
    *n_out = nt;
    return 0;
}

/* =========================================================================================
 * The zip container. libarchive enumerates the entries from the central directory (ZIP64
 * included). It reads from our mapping with no copy, so the first data block of a stored entry
 * is a pointer into the mapping: that gives the data offset (libarchive's header position is
 * where its previous read stopped, not the local header, in seekable mode). A compressed entry
 * comes back decompressed into libarchive's own buffer, which is how it is detected.
 * ========================================================================================= */

typedef struct { char *name; uint64_t off, size; } zentry;
static int zentry_cmp(const void *a, const void *b) { return strcmp(((const zentry *)a)->name, ((const zentry *)b)->name); }

static const zentry *zfind(const zentry *e, size_t n, const char *name) {
    zentry key = {.name = (char *)name};
    return bsearch(&key, e, n, sizeof *e, zentry_cmp);
}

static int list_zip(const uint8_t *data, uint64_t size, const char *where, zentry **out, size_t *n_out, char **prefix) {
    struct archive *a = archive_read_new();
    archive_read_support_format_zip_seekable(a);
    /* Checksumming would read every byte of every tensor; listing must touch headers only. */
    archive_read_set_options(a, "zip:ignorecrc32");
    zentry *e = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    *prefix = NULL;
    if (archive_read_open_memory(a, data, (size_t)size) != ARCHIVE_OK) {
        rc = pln_errorf("%s: not a readable zip archive: %s", where, archive_error_string(a));
        goto done;
    }
    struct archive_entry *ent;
    int r;
    while ((r = archive_read_next_header(a, &ent)) == ARCHIVE_OK) {
        const char *name = archive_entry_pathname(ent);
        if (!name) name = archive_entry_pathname_utf8(ent);
        if (!name) { rc = pln_errorf("%s: zip entry #%zu has an unreadable name", where, n); goto done; }
        if (!*prefix) {
            const char *slash = strchr(name, '/');
            if (!slash || slash == name) {
                rc = pln_errorf("%s: first zip entry \"%s\" is not inside a top-level folder (not a torch.save file)", where, name);
                goto done;
            }
            *prefix = pln_xasprintf("%.*s", (int)(slash - name + 1), name);
        }
        if (strncmp(name, *prefix, strlen(*prefix))) continue;   /* torch reads only its own folder */
        if (archive_entry_is_encrypted(ent)) { rc = pln_errorf("%s: zip entry \"%s\" is encrypted", where, name); goto done; }
        if (!archive_entry_size_is_set(ent) || archive_entry_size(ent) < 0) {
            rc = pln_errorf("%s: zip entry \"%s\" has no size in the central directory", where, name);
            goto done;
        }
        uint64_t esz = (uint64_t)archive_entry_size(ent), off = 0;
        const void *blk;
        size_t blen;
        la_int64_t boff;
        if (esz > 0) {
            r = archive_read_data_block(a, &blk, &blen, &boff);
            if (r == ARCHIVE_FATAL || r == ARCHIVE_FAILED || (r != ARCHIVE_OK && r != ARCHIVE_WARN) || boff != 0 ||
                (const uint8_t *)blk < data || (const uint8_t *)blk >= data + size) {
                if (r == ARCHIVE_OK || r == ARCHIVE_WARN || r == ARCHIVE_EOF)
                    rc = pln_errorf("%s: zip entry \"%s\" is compressed; torch.save writes stored (uncompressed) "
                                    "entries: re-save the checkpoint with torch.save", where, name);
                else
                    rc = pln_errorf("%s: zip entry \"%s\": %s", where, name, archive_error_string(a));
                goto done;
            }
            off = (uint64_t)((const uint8_t *)blk - data);
            if (esz > size - off) {
                rc = pln_errorf("%s: zip entry \"%s\": %llu bytes at offset %llu run past the end of the file (%llu bytes); file truncated?",
                                where, name, (unsigned long long)esz, (unsigned long long)off, (unsigned long long)size);
                goto done;
            }
        }
        e = grow(e, &cap, n + 1, sizeof *e);
        e[n++] = (zentry){pln_xstrdup(name), off, esz};
    }
    if (r != ARCHIVE_EOF) { rc = pln_errorf("%s: corrupt zip: %s", where, archive_error_string(a)); goto done; }
    if (!*prefix) { rc = pln_errorf("%s: empty zip archive (not a torch.save file)", where); goto done; }
    qsort(e, n, sizeof *e, zentry_cmp);
    for (size_t k = 1; k < n; k++)
        if (!strcmp(e[k].name, e[k - 1].name)) { rc = pln_errorf("%s: duplicate zip entry \"%s\"", where, e[k].name); goto done; }
done:
    archive_read_free(a);
    if (rc) {
        for (size_t k = 0; k < n; k++) free(e[k].name);
        free(e);
        free(*prefix);
        *prefix = NULL;
        return -1;
    }
    *out = e;
    *n_out = n;
    return 0;
}

int pln_torchzip_parse(pln_torchzip *tz, const uint8_t *data, uint64_t size, const char *where) {
    memset(tz, 0, sizeof *tz);
    tz->map.fd = -1;
    if (size >= 2 && data[0] == 0x80 && data[1] <= 5)
        return pln_errorf("%s: unsupported legacy format, re-save with torch >= 1.6 (this is a pre-1.6 torch.save file, not a zip)", where);
    if (size < 4 || memcmp(data, "PK\x03\x04", 4))
        return pln_errorf("%s: not a PyTorch zip checkpoint (no zip signature at the start)", where);
    zentry *ents = NULL;
    size_t ne = 0;
    char *prefix = NULL;
    if (list_zip(data, size, where, &ents, &ne, &prefix)) return -1;
    int rc = 0;
    pln_pickle_tensor *pt = NULL;
    int64_t npt = 0;
    char *nm = pln_xasprintf("%sbyteorder", prefix);
    const zentry *ze = zfind(ents, ne, nm);
    free(nm);
    if (ze && !(ze->size == 6 && !memcmp(data + ze->off, "little", 6))) {
        rc = pln_errorf("%s: checkpoint is not little-endian (byteorder entry); re-save it on a little-endian machine", where);
        goto done;
    }
    nm = pln_xasprintf("%sdata.pkl", prefix);
    ze = zfind(ents, ne, nm);
    free(nm);
    if (!ze) { rc = pln_errorf("%s: no %sdata.pkl entry (not a torch.save file)", where, prefix); goto done; }
    char *pwhere = pln_xasprintf("%s: %sdata.pkl", where, prefix);
    rc = pln_unpickle_state_dict(data + ze->off, ze->size, pwhere, &pt, &npt);
    free(pwhere);
    if (rc) goto done;
    tz->tensors = pln_xcalloc((size_t)npt + 1, sizeof *tz->tensors);
    for (int64_t i = 0; i < npt && !rc; i++) {
        pln_pickle_tensor *p = &pt[i];
        pln_tensor *t = &tz->tensors[i];
        t->name = p->name;
        p->name = NULL;
        tz->n_tensors++;
        t->dtype = p->dtype;
        t->ndim = p->ndim;
        memcpy(t->shape, p->shape, sizeof t->shape);
        uint64_t es = pln_dtype_size(p->dtype), numel = 1, last = (uint64_t)p->storage_offset, prod;
        bool ovf = false, contig = true;
        uint64_t expect = 1;
        for (int d = p->ndim - 1; d >= 0; d--) {
            ovf |= pln_mul_overflow(numel, (uint64_t)p->shape[d], &numel);
            if (p->shape[d] > 1 && (uint64_t)p->stride[d] != expect) contig = false;
            ovf |= pln_mul_overflow(expect, (uint64_t)p->shape[d], &expect);
            if (p->shape[d] > 0) {
                ovf |= pln_mul_overflow((uint64_t)p->shape[d] - 1, (uint64_t)p->stride[d], &prod);
                ovf |= pln_add_overflow(last, prod, &last);
            }
        }
        /* span: elements from the first to one past the last one the view touches */
        uint64_t span_el = numel ? last - (uint64_t)p->storage_offset + 1 : 0, end_el, need_bytes, have_el;
        ovf |= pln_add_overflow((uint64_t)p->storage_offset, span_el, &end_el);
        ovf |= pln_mul_overflow(end_el, es, &need_bytes);
        ovf |= pln_mul_overflow(contig ? numel : span_el, es, &t->nbytes);
        if (ovf) { rc = pln_errorf("%s: tensor \"%s\": size/stride/offset overflow 64 bits", where, t->name); break; }
        have_el = (uint64_t)p->storage_numel;
        if (numel && end_el > have_el) {
            rc = pln_errorf("%s: tensor \"%s\": view ends at element %llu but its storage %s holds %llu", where, t->name,
                            (unsigned long long)end_el, p->storage_key, (unsigned long long)have_el);
            break;
        }
        nm = pln_xasprintf("%sdata/%s", prefix, p->storage_key);
        ze = zfind(ents, ne, nm);
        free(nm);
        if (!ze) { rc = pln_errorf("%s: tensor \"%s\": storage entry %sdata/%s is missing", where, t->name, prefix, p->storage_key); break; }
        if (numel && need_bytes > ze->size) {
            rc = pln_errorf("%s: tensor \"%s\": needs %llu bytes of storage %sdata/%s, which holds %llu", where, t->name,
                            (unsigned long long)need_bytes, prefix, p->storage_key, (unsigned long long)ze->size);
            break;
        }
        t->contiguous = contig;
        t->file_offset = ze->off + (uint64_t)p->storage_offset * es;
        t->data = numel ? data + t->file_offset : data + ze->off;
        if (!numel) t->file_offset = ze->off;
        t->file = where;
    }
done:
    pln_pickle_tensors_free(pt, npt);
    for (size_t k = 0; k < ne; k++) free(ents[k].name);
    free(ents);
    if (rc) { free(prefix); pln_torchzip_close(tz); return -1; }
    tz->prefix = prefix;
    return 0;
}

int pln_torchzip_open(pln_torchzip *tz, const char *path) {
    pln_map m;
    memset(tz, 0, sizeof *tz);
    tz->map.fd = -1;
    if (pln_map_open(&m, path) != 0) return -1;
    if (pln_torchzip_parse(tz, m.data, m.size, m.path) != 0) { pln_map_close(&m); return -1; }
    tz->map = m;
    tz->path = pln_xstrdup(path);
    return 0;
}

const pln_tensor *pln_torchzip_find(const pln_torchzip *tz, const char *name) {
    for (int64_t i = 0; i < tz->n_tensors; i++)
        if (!strcmp(tz->tensors[i].name, name)) return &tz->tensors[i];
    return NULL;
}

void pln_torchzip_close(pln_torchzip *tz) {
    if (!tz) return;
    for (int64_t i = 0; i < tz->n_tensors; i++) free(tz->tensors[i].name);
    free(tz->tensors);
    free(tz->prefix);
    free(tz->path);
    if (tz->map.data || tz->map.fd >= 0) pln_map_close(&tz->map);
    memset(tz, 0, sizeof *tz);
    tz->map.fd = -1;
}
