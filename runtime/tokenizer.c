/* tokenizer.c — BLOOM's tokenizer.json pipeline (added tokens → Split regex, Isolated →
 * ByteLevel → BPE; ByteLevel decoder), matching Hugging Face `tokenizers` id for id.
 * See tokenizer.h for the contract. */
#include "runtime/tokenizer.h"

#include "formats/common.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* tokenizer.json files larger than this are refused (BLOOM's is 14.5 MB). */
#define TOK_MAX_FILE_BYTES ((size_t)1 << 30)
/* Pieces at most this long are remembered in the word cache (direct-mapped: a new piece replaces
 * whatever held its slot). */
#define TOK_CACHE_MAX_PIECE 64
#define TOK_CACHE_SLOTS (1u << 16)
/* Largest vocabulary accepted (BLOOM has 250680 ids). */
#define TOK_MAX_IDS (1 << 24)

/* ---- small helpers --------------------------------------------------------------------- */

static uint64_t tok_hash_bytes(const void *p, size_t n) {
    /* 8 bytes at a time with a multiply-xorshift mix: keys are short strings */
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
        s += 8; n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0x94d049bb133111ebull;
    h ^= h >> 32;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return h;
}

static uint64_t tok_hash_u64(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static size_t tok_pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Length of the valid UTF-8 sequence starting at s[0] (strict: no overlongs, surrogates or
 * code points above U+10FFFF), or 0 if invalid or truncated. */
static size_t tok_utf8_len(const uint8_t *s, size_t avail) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 0;
    if (avail < n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

/* Encodes code point cp as UTF-8 into out (4 bytes room); returns the length. */
static int tok_utf8_put(uint32_t cp, uint8_t *out) {
    if (cp < 0x80) { out[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { out[0] = (uint8_t)(0xC0 | (cp >> 6)); out[1] = (uint8_t)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12)); out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F)); return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18)); out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* A growable byte buffer. */
typedef struct { uint8_t *p; size_t n, cap; } tok_buf;

static void tok_buf_put(tok_buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        b->p = pln_xrealloc(b->p, c);
        b->cap = c;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

/* ---- the tokenizer ---------------------------------------------------------------------- */

typedef struct {
    char *content;          /* text matched in the input */
    size_t len;
    int32_t id;
    bool special;
    bool normalized;        /* matched in the second pass (HF matches non-normalized ones first) */
} tok_added;

/* One remembered piece → ids (word cache entry). */
typedef struct {
    uint8_t *key;           /* NULL = empty slot */
    size_t key_len;
    int32_t *ids;
    int32_t n_ids;
} tok_cache_slot;

struct pln_tokenizer {
    char *path;
    int64_t n_ids;                 /* vocab size: 1 + largest id */
    /* id → token string (tokenizer.json spelling) and raw bytes; NULL for unused ids. */
    char **tok_str;                /* into str_arena */
    uint32_t *tok_str_len;
    uint64_t *tok_bytes_off;       /* into bytes_arena; UINT64_MAX = unused id */
    uint32_t *tok_bytes_len;
    char *str_arena;
    uint8_t *bytes_arena;
    bool *is_special;
    size_t max_token_bytes;
    /* model.vocab: string → id, open addressing; a slot is (hash high 32 bits << 32) | id,
     * UINT64_MAX when empty, so most probes never touch the strings. */
    uint64_t *vocab_slots;
    size_t vocab_mask;
    /* merges: (left id, right id) → rank and merged id. */
    struct tok_pair { uint64_t key; uint32_t rank; int32_t new_id; } *pairs;   /* key UINT64_MAX = empty */
    size_t pair_mask;
    /* byte → id of its ByteLevel character in the vocab (-1 if absent). */
    int32_t byte_id[256];
    int32_t unk_id;                /* -1 if none */
    bool fuse_unk, ignore_merges;
    /* added tokens: first pass (non-normalized), second pass (normalized) */
    tok_added *added;
    int n_added;
    bool added_first_byte[2][256];
    /* pre-tokenizer Split regex (NULL: the whole segment is one piece) */
    pcre2_code *re;
    /* word cache */
    pthread_mutex_t cache_mu;
    tok_cache_slot *cache;
    size_t cache_used;
};

/* GPT-2 bytes_to_unicode(): printable bytes map to themselves, the rest to U+0100 upwards. */
static void tok_byte_map(uint32_t cp_of_byte[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_of_byte[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

static int32_t tok_vocab_find(const pln_tokenizer *t, const char *s, size_t n) {
    if (!t->vocab_slots) return -1;
    uint64_t h = tok_hash_bytes(s, n);
    uint32_t fp = (uint32_t)(h >> 32);
    size_t i = h & t->vocab_mask;
    for (;;) {
        uint64_t e = t->vocab_slots[i];
        if (e == UINT64_MAX) return -1;
        int32_t id = (int32_t)(uint32_t)e;
        if ((uint32_t)(e >> 32) == fp && t->tok_str_len[id] == n && memcmp(t->tok_str[id], s, n) == 0) return id;
        i = (i + 1) & t->vocab_mask;
    }
}

static bool tok_pair_find(const pln_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = tok_hash_u64(key) & t->pair_mask;
    for (;;) {
        const struct tok_pair *e = &t->pairs[i];
        if (e->key == UINT64_MAX) return false;
        if (e->key == key) { *rank = e->rank; *new_id = e->new_id; return true; }
        i = (i + 1) & t->pair_mask;
    }
}

static void tok_pair_put(pln_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = tok_hash_u64(key) & t->pair_mask;
    while (t->pairs[i].key != UINT64_MAX && t->pairs[i].key != key) i = (i + 1) & t->pair_mask;
    /* A repeated pair keeps the later rank, like HF's HashMap collect. */
    t->pairs[i] = (struct tok_pair){key, rank, new_id};
}

/* Raw bytes of a token string into out (room for n + 1): each character through the inverse
 * ByteLevel map; a string with a character outside the map is kept as its own UTF-8 (HF's
 * ByteLevel decoder does the same). Returns the length. */
static uint32_t tok_string_bytes(const char *s, size_t n, const int16_t *byte_of_cp, uint8_t *out) {
    size_t o = 0;
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        size_t l = tok_utf8_len(u + i, n - i);
        uint32_t cp;
        if (l == 1) cp = u[i];
        else if (l == 2) cp = ((uint32_t)(u[i] & 0x1F) << 6) | (u[i + 1] & 0x3F);
        else cp = 0xFFFFFFFF;
        if (l == 0 || cp >= 324 || byte_of_cp[cp] < 0) { memcpy(out, s, n); o = n; break; }
        out[o++] = (uint8_t)byte_of_cp[cp];
        i += l;
    }
    out[o] = 0;
    return (uint32_t)o;
}

/* Translates an Oniguruma pattern (what `tokenizers` compiles) to PCRE2: nested character
 * classes `[a[bc]]` are unions, flattened here; \s is Unicode White_Space in Oniguruma, which
 * differs from PCRE2's UCP \s (it adds U+0085), so it is spelled out. NULL + error if the pattern
 * uses something we do not translate. */
static char *tok_onig_to_pcre2(const char *pat, const char *path) {
    static const char ws[] = "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
                             "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
    tok_buf b = {0};
    int depth = 0;
    size_t n = strlen(pat);
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            char e = pat[++i];
            if (e == 's') {
                if (depth) tok_buf_put(&b, ws, strlen(ws));
                else { tok_buf_put(&b, "[", 1); tok_buf_put(&b, ws, strlen(ws)); tok_buf_put(&b, "]", 1); }
            } else if (e == 'S') {
                if (depth) goto unsupported;
                tok_buf_put(&b, "[^", 2); tok_buf_put(&b, ws, strlen(ws)); tok_buf_put(&b, "]", 1);
            } else {
                tok_buf_put(&b, "\\", 1); tok_buf_put(&b, &e, 1);
            }
            continue;
        }
        if (depth == 0) {
            tok_buf_put(&b, &c, 1);
            if (c == '[') {
                depth = 1;
                if (i + 1 < n && pat[i + 1] == '^') { tok_buf_put(&b, "^", 1); i++; }
                if (i + 1 < n && pat[i + 1] == ']') { tok_buf_put(&b, "\\]", 2); i++; }
            }
            continue;
        }
        if (c == '[') {
            if (i + 1 < n && pat[i + 1] == ':') {          /* POSIX [:alpha:] copied as is */
                const char *end = strstr(pat + i, ":]");
                if (!end) goto unsupported;
                size_t l = (size_t)(end - (pat + i)) + 2;
                tok_buf_put(&b, pat + i, l);
                i += l - 1;
                continue;
            }
            if (i + 1 < n && pat[i + 1] == '^') goto unsupported;   /* negated nested class */
            depth++;
            continue;
        }
        if (c == ']') {
            if (--depth == 0) tok_buf_put(&b, "]", 1);
            continue;
        }
        if (c == '&' && i + 1 < n && pat[i + 1] == '&') goto unsupported;   /* class intersection */
        tok_buf_put(&b, &c, 1);
    }
    if (depth) goto unsupported;
    tok_buf_put(&b, "", 1);
    return (char *)b.p;
unsupported:
    free(b.p);
    pln_errorf("%s: pre_tokenizer Split pattern \"%s\" uses a regex construct pollen does not translate "
               "(negated nested class, &&, \\S in a class, or an unclosed class)", path, pat);
    return NULL;
}

static const char *tok_json_type(json_t *o) {
    json_t *ty = json_is_object(o) ? json_object_get(o, "type") : NULL;
    return json_is_string(ty) ? json_string_value(ty) : NULL;
}

static bool tok_json_false(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return v == NULL || json_is_false(v) || json_is_null(v);
}

/* Compiles the Split pre-tokenizer. */
static int tok_load_split(pln_tokenizer *t, json_t *sp) {
    json_t *pat = json_object_get(sp, "pattern");
    json_t *rx = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
    json_t *lit = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
    const char *beh = json_string_value(json_object_get(sp, "behavior"));
    if (!beh || strcmp(beh, "Isolated") != 0)
        return pln_errorf("%s: pre_tokenizer Split behavior \"%s\" is not supported (only Isolated, as BLOOM)",
                          t->path, beh ? beh : "(missing)");
    if (!tok_json_false(sp, "invert"))
        return pln_errorf("%s: pre_tokenizer Split invert=true is not supported", t->path);
    char *src;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP;
    if (json_is_string(rx)) {
        src = tok_onig_to_pcre2(json_string_value(rx), t->path);
        if (!src) return -1;
    } else if (json_is_string(lit)) {
        src = pln_xstrdup(json_string_value(lit));
        opts |= PCRE2_LITERAL;
        if (!src[0]) { free(src); return pln_errorf("%s: pre_tokenizer Split pattern is an empty string", t->path); }
    } else {
        return pln_errorf("%s: pre_tokenizer Split has no pattern.Regex or pattern.String", t->path);
    }
    int ec; PCRE2_SIZE eo;
    t->re = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        pln_errorf("%s: pre_tokenizer Split pattern does not compile (as PCRE2 \"%s\", offset %zu): %s",
                   t->path, src, (size_t)eo, (char *)msg);
        free(src);
        return -1;
    }
    free(src);
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);   /* falls back to the interpreter on failure */
    return 0;
}

static int tok_load_byte_level_pre(pln_tokenizer *t, json_t *bl) {
    if (!tok_json_false(bl, "add_prefix_space"))
        return pln_errorf("%s: pre_tokenizer ByteLevel add_prefix_space=true is not supported (BLOOM has false)", t->path);
    if (!tok_json_false(bl, "use_regex"))
        return pln_errorf("%s: pre_tokenizer ByteLevel use_regex=true (GPT-2 regex) is not supported "
                          "(BLOOM has false and a Split before it)", t->path);
    return 0;
}

static int tok_load_pipeline(pln_tokenizer *t, json_t *root) {
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm))
        return pln_errorf("%s: normalizer \"%s\" is not supported (BLOOM has none: null)", t->path,
                          tok_json_type(norm) ? tok_json_type(norm) : "?");
    json_t *pre = json_object_get(root, "pre_tokenizer");
    const char *pty = tok_json_type(pre);
    if (!pty) return pln_errorf("%s: pre_tokenizer missing or without a type (expected Sequence[Split, ByteLevel])", t->path);
    if (strcmp(pty, "Sequence") == 0) {
        json_t *arr = json_object_get(pre, "pretokenizers");
        const char *t0 = tok_json_type(json_array_get(arr, 0)), *t1 = tok_json_type(json_array_get(arr, 1));
        if (json_array_size(arr) != 2 || !t0 || !t1 || strcmp(t0, "Split") || strcmp(t1, "ByteLevel"))
            return pln_errorf("%s: pre_tokenizer.pretokenizers must be [Split, ByteLevel] as in BLOOM", t->path);
        if (tok_load_split(t, json_array_get(arr, 0)) || tok_load_byte_level_pre(t, json_array_get(arr, 1))) return -1;
    } else if (strcmp(pty, "ByteLevel") == 0) {
        if (tok_load_byte_level_pre(t, pre)) return -1;
    } else {
        return pln_errorf("%s: pre_tokenizer type \"%s\" is not supported (expected Sequence[Split, ByteLevel])", t->path, pty);
    }
    json_t *dec = json_object_get(root, "decoder");
    const char *dty = tok_json_type(dec);
    if (!dty || strcmp(dty, "ByteLevel") != 0)
        return pln_errorf("%s: decoder \"%s\" is not supported (expected ByteLevel)", t->path, dty ? dty : "null");
    json_t *post = json_object_get(root, "post_processor");
    const char *poty = tok_json_type(post);
    if (post && !json_is_null(post) && (!poty || strcmp(poty, "ByteLevel") != 0))
        return pln_errorf("%s: post_processor \"%s\" is not supported (BLOOM adds no special tokens: null or ByteLevel)",
                          t->path, poty ? poty : "?");
    return 0;
}

/* ---- model.vocab and model.merges -------------------------------------------------------
 * These two hold nearly all of a 14.5 MB BLOOM tokenizer.json. A generic DOM (jansson) spends
 * most of a second on them, so a small strict scanner reads just those two values straight into
 * one string arena; jansson then parses the rest of the document (with the two values blanked)
 * for everything else. Whatever the scanner does not understand falls back to jansson whole. */

typedef struct {
    tok_buf arena;                /* NUL-terminated strings */
    size_t *v_off; uint32_t *v_len; int64_t *v_id; size_t nv, v_cap;
    size_t *m_off; uint32_t *m_la, *m_lb; size_t nm, m_cap;   /* a at m_off, b right after a's NUL */
} tok_lists;

static void tok_lists_free(tok_lists *l) {
    free(l->arena.p); free(l->v_off); free(l->v_len); free(l->v_id);
    free(l->m_off); free(l->m_la); free(l->m_lb);
    memset(l, 0, sizeof *l);
}

static size_t tok_arena_put(tok_buf *a, const char *s, size_t n) {
    size_t off = a->n;
    tok_buf_put(a, s, n);
    tok_buf_put(a, "", 1);
    return off;
}

static void tok_lists_vocab(tok_lists *l, size_t off, size_t len, int64_t id) {
    if (l->nv == l->v_cap) {
        l->v_cap = l->v_cap ? l->v_cap * 2 : 1024;
        l->v_off = pln_xrealloc(l->v_off, l->v_cap * sizeof *l->v_off);
        l->v_len = pln_xrealloc(l->v_len, l->v_cap * sizeof *l->v_len);
        l->v_id = pln_xrealloc(l->v_id, l->v_cap * sizeof *l->v_id);
    }
    l->v_off[l->nv] = off; l->v_len[l->nv] = (uint32_t)len; l->v_id[l->nv] = id;
    l->nv++;
}

static void tok_lists_merge(tok_lists *l, size_t off, size_t la, size_t lb) {
    if (l->nm == l->m_cap) {
        l->m_cap = l->m_cap ? l->m_cap * 2 : 1024;
        l->m_off = pln_xrealloc(l->m_off, l->m_cap * sizeof *l->m_off);
        l->m_la = pln_xrealloc(l->m_la, l->m_cap * sizeof *l->m_la);
        l->m_lb = pln_xrealloc(l->m_lb, l->m_cap * sizeof *l->m_lb);
    }
    l->m_off[l->nm] = off; l->m_la[l->nm] = (uint32_t)la; l->m_lb[l->nm] = (uint32_t)lb;
    l->nm++;
}

/* A merge "a b" (exactly one space) or the two strings of [a, b], appended as "a\0b\0". */
static int tok_lists_merge_str(tok_lists *l, const char *s, size_t n) {
    const char *sp = memchr(s, ' ', n);
    if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1)) return -1;
    size_t la = (size_t)(sp - s);
    size_t off = tok_arena_put(&l->arena, s, la);
    tok_arena_put(&l->arena, sp + 1, n - la - 1);
    tok_lists_merge(l, off, la, n - la - 1);
    return 0;
}

typedef struct { const char *p, *end; int depth; } tok_scan;

static void ts_ws(tok_scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static bool ts_lit(tok_scan *s, char c) {
    ts_ws(s);
    if (s->p < s->end && *s->p == c) { s->p++; return true; }
    return false;
}

static int ts_hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

/* A JSON string (opening quote next), unescaped into out (NULL: skipped); UTF-8 validated,
 * NUL refused. -1 on anything malformed. */
static int ts_string(tok_scan *s, tok_buf *out) {
    ts_ws(s);
    if (s->p >= s->end || *s->p != '"') return -1;
    s->p++;
    for (;;) {
        const char *q = s->p;
        while (q < s->end && *q != '"' && *q != '\\' && (uint8_t)*q >= 0x20) q++;
        if (q >= s->end || (uint8_t)*q < 0x20) return -1;
        if (out) tok_buf_put(out, s->p, (size_t)(q - s->p));
        for (const uint8_t *u = (const uint8_t *)s->p; u < (const uint8_t *)q;) {
            if (*u < 0x80) { u++; continue; }
            size_t l = tok_utf8_len(u, (size_t)((const uint8_t *)q - u));
            if (!l) return -1;
            u += l;
        }
        s->p = q + 1;
        if (*q == '"') return 0;
        if (s->p >= s->end) return -1;
        char e = *s->p++;
        uint8_t u8[4];
        int ul = 1;
        switch (e) {
        case '"': u8[0] = '"'; break;
        case '\\': u8[0] = '\\'; break;
        case '/': u8[0] = '/'; break;
        case 'b': u8[0] = '\b'; break;
        case 'f': u8[0] = '\f'; break;
        case 'n': u8[0] = '\n'; break;
        case 'r': u8[0] = '\r'; break;
        case 't': u8[0] = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (s->end - s->p < 4 || ts_hex4(s->p, &cp)) return -1;
            s->p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u' || ts_hex4(s->p + 2, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF) return -1;
                s->p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if ((cp >= 0xDC00 && cp <= 0xDFFF) || cp == 0) {
                return -1;
            }
            ul = tok_utf8_put(cp, u8);
            break;
        }
        default: return -1;
        }
        if (out) tok_buf_put(out, u8, (size_t)ul);
    }
}

static int ts_int(tok_scan *s, int64_t *v) {
    ts_ws(s);
    const char *p = s->p;
    bool neg = p < s->end && *p == '-';
    if (neg) p++;
    if (p >= s->end || *p < '0' || *p > '9') return -1;
    int64_t x = 0;
    while (p < s->end && *p >= '0' && *p <= '9') {
        if (x > (INT64_MAX - 9) / 10) return -1;
        x = x * 10 + (*p++ - '0');
    }
    if (p < s->end && (*p == '.' || *p == 'e' || *p == 'E')) return -1;
    s->p = p;
    *v = neg ? -x : x;
    return 0;
}

static int ts_skip(tok_scan *s) {
    ts_ws(s);
    if (s->p >= s->end || ++s->depth > 128) return -1;
    char c = *s->p;
    int rc = 0;
    if (c == '"') rc = ts_string(s, NULL);
    else if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        s->p++;
        if (!ts_lit(s, close)) {
            do {
                if (c == '{' && (ts_string(s, NULL) || !ts_lit(s, ':'))) { rc = -1; break; }
                if (ts_skip(s)) { rc = -1; break; }
            } while (ts_lit(s, ','));
            if (!rc && !ts_lit(s, close)) rc = -1;
        }
    } else {
        /* number or literal: the characters they are made of */
        const char *q = s->p;
        while (q < s->end && (strchr("+-.0123456789eEtruefalsn", *q) != NULL) && *q) q++;
        if (q == s->p) rc = -1;
        s->p = q;
    }
    s->depth--;
    return rc;
}

/* model.vocab: {"token": id, ...} */
static int ts_vocab(tok_scan *s, tok_lists *l) {
    if (!ts_lit(s, '{')) return -1;
    if (ts_lit(s, '}')) return 0;
    do {
        size_t off = l->arena.n;
        if (ts_string(s, &l->arena)) return -1;
        size_t len = l->arena.n - off;
        tok_buf_put(&l->arena, "", 1);
        int64_t id;
        if (!ts_lit(s, ':') || ts_int(s, &id)) return -1;
        tok_lists_vocab(l, off, len, id);
    } while (ts_lit(s, ','));
    return ts_lit(s, '}') ? 0 : -1;
}

/* model.merges: ["a b", ...] or [["a", "b"], ...] */
static int ts_merges(tok_scan *s, tok_lists *l, tok_buf *tmp) {
    if (!ts_lit(s, '[')) return -1;
    if (ts_lit(s, ']')) return 0;
    do {
        ts_ws(s);
        if (s->p < s->end && *s->p == '[') {
            s->p++;
            size_t off = l->arena.n;
            if (ts_string(s, &l->arena)) return -1;
            size_t la = l->arena.n - off;
            tok_buf_put(&l->arena, "", 1);
            size_t ob = l->arena.n;
            if (!ts_lit(s, ',') || ts_string(s, &l->arena)) return -1;
            size_t lb = l->arena.n - ob;
            tok_buf_put(&l->arena, "", 1);
            if (!ts_lit(s, ']')) return -1;
            tok_lists_merge(l, off, la, lb);
        } else {
            tmp->n = 0;
            if (ts_string(s, tmp) || tok_lists_merge_str(l, (const char *)tmp->p, tmp->n)) return -1;
        }
    } while (ts_lit(s, ','));
    return ts_lit(s, ']') ? 0 : -1;
}

/* Scans the document for model.vocab and model.merges, filling l and recording their byte
 * ranges. Returns 0 when both were read (ranges set), -1 to fall back to jansson. */
static int tok_fast_scan(const char *text, size_t len, tok_lists *l, size_t rng[2][2]) {
    tok_scan s = {text, text + len, 0};
    tok_buf key = {0}, tmp = {0};
    int found = 0, rc = -1;
    if (!ts_lit(&s, '{')) goto out;
    if (ts_lit(&s, '}')) goto out;
    do {
        key.n = 0;
        if (ts_string(&s, &key) || !ts_lit(&s, ':')) goto out;
        /* a repeated key: jansson keeps the last one; let it decide everything */
        if (key.n == 5 && memcmp(key.p, "model", 5) == 0) {
            if (found & 4) goto out;
            found |= 4;
            if (!ts_lit(&s, '{')) goto out;
            if (ts_lit(&s, '}')) goto out;
            do {
                key.n = 0;
                if (ts_string(&s, &key) || !ts_lit(&s, ':')) goto out;
                ts_ws(&s);
                size_t start = (size_t)(s.p - text);
                if (key.n == 5 && memcmp(key.p, "vocab", 5) == 0) {
                    if ((found & 1) || ts_vocab(&s, l)) goto out;
                    rng[0][0] = start; rng[0][1] = (size_t)(s.p - text);
                    found |= 1;
                } else if (key.n == 6 && memcmp(key.p, "merges", 6) == 0) {
                    if ((found & 2) || ts_merges(&s, l, &tmp)) goto out;
                    rng[1][0] = start; rng[1][1] = (size_t)(s.p - text);
                    found |= 2;
                } else if (ts_skip(&s)) {
                    goto out;
                }
            } while (ts_lit(&s, ','));
            if (!ts_lit(&s, '}')) goto out;
        } else if (ts_skip(&s)) {
            goto out;
        }
    } while (ts_lit(&s, ','));
    if (ts_lit(&s, '}') && (found & 3) == 3) rc = 0;
out:
    free(key.p); free(tmp.p);
    return rc;
}

/* The same lists from a jansson document (the fallback path, and the messages it gives). */
static int tok_lists_from_json(pln_tokenizer *t, json_t *model, tok_lists *l) {
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab)) return pln_errorf("%s: model.vocab missing or not an object", t->path);
    if (merges && !json_is_array(merges)) return pln_errorf("%s: model.merges is not an array", t->path);
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val))
            return pln_errorf("%s: model.vocab[\"%s\"] is not an integer id", t->path, key);
        size_t off = tok_arena_put(&l->arena, key, strlen(key));
        tok_lists_vocab(l, off, strlen(key), json_integer_value(val));
    }
    size_t i;
    json_array_foreach(merges, i, val) {
        if (json_is_string(val)) {
            if (tok_lists_merge_str(l, json_string_value(val), json_string_length(val)))
                return pln_errorf("%s: model.merges[%zu] \"%s\" is not \"a b\"", t->path, i, json_string_value(val));
        } else if (json_is_array(val) && json_array_size(val) == 2 && json_is_string(json_array_get(val, 0)) &&
                   json_is_string(json_array_get(val, 1))) {
            json_t *a = json_array_get(val, 0), *b = json_array_get(val, 1);
            size_t off = tok_arena_put(&l->arena, json_string_value(a), json_string_length(a));
            tok_arena_put(&l->arena, json_string_value(b), json_string_length(b));
            tok_lists_merge(l, off, json_string_length(a), json_string_length(b));
        } else {
            return pln_errorf("%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", t->path, i);
        }
    }
    return 0;
}

static int tok_load_model(pln_tokenizer *t, json_t *root, tok_lists *l, const int16_t *byte_of_cp) {
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return pln_errorf("%s: model missing or not an object", t->path);
    const char *ty = tok_json_type(model);
    if (ty && strcmp(ty, "BPE") != 0) return pln_errorf("%s: model.type \"%s\" is not supported (expected BPE)", t->path, ty);
    json_t *v;
    if ((v = json_object_get(model, "dropout")) && !json_is_null(v))
        return pln_errorf("%s: model.dropout must be null (BPE dropout is random at encode time)", t->path);
    if ((v = json_object_get(model, "continuing_subword_prefix")) && !json_is_null(v) && !(json_is_string(v) && !json_string_value(v)[0]))
        return pln_errorf("%s: model.continuing_subword_prefix is not supported (BLOOM has null)", t->path);
    if ((v = json_object_get(model, "end_of_word_suffix")) && !json_is_null(v) && !(json_is_string(v) && !json_string_value(v)[0]))
        return pln_errorf("%s: model.end_of_word_suffix is not supported (BLOOM has null)", t->path);
    if (!tok_json_false(model, "byte_fallback"))
        return pln_errorf("%s: model.byte_fallback=true is not supported (BLOOM has false)", t->path);
    t->fuse_unk = !tok_json_false(model, "fuse_unk");
    t->ignore_merges = !tok_json_false(model, "ignore_merges");
    if (!l->v_off && tok_lists_from_json(t, model, l)) return -1;
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added)) return pln_errorf("%s: added_tokens is not an array", t->path);

    /* vocabulary size: 1 + the largest id anywhere */
    int64_t max_id = -1;
    for (size_t i = 0; i < l->nv; i++) {
        if (l->v_id[i] < 0 || l->v_id[i] >= INT32_MAX)
            return pln_errorf("%s: model.vocab[\"%s\"] is not an id in [0, 2^31)", t->path, (char *)l->arena.p + l->v_off[i]);
        if (l->v_id[i] > max_id) max_id = l->v_id[i];
    }
    size_t i;
    json_t *val;
    json_array_foreach(added, i, val) {
        json_t *id = json_object_get(val, "id");
        json_t *c = json_object_get(val, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX)
            return pln_errorf("%s: added_tokens[%zu].id missing or not an id in [0, 2^31)", t->path, i);
        if (!json_is_string(c) || json_string_length(c) == 0 || strlen(json_string_value(c)) != json_string_length(c))
            return pln_errorf("%s: added_tokens[%zu].content missing, empty or holding NUL", t->path, i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    if (max_id < 0) return pln_errorf("%s: model.vocab is empty", t->path);
    /* tables are indexed by id: refuse ids far beyond any real vocabulary instead of
     * allocating gigabytes for a hostile file */
    if (max_id >= TOK_MAX_IDS)
        return pln_errorf("%s: token id %lld is too large (ids must be < %d)", t->path, (long long)max_id, TOK_MAX_IDS);
    t->n_ids = max_id + 1;
    /* ids → offsets into the arena first (it still grows), pointers at the end */
    size_t *str_off = pln_xmalloc((size_t)t->n_ids * sizeof *str_off);
    memset(str_off, 0xFF, (size_t)t->n_ids * sizeof *str_off);
    t->tok_str_len = pln_xcalloc((size_t)t->n_ids, sizeof *t->tok_str_len);
    t->is_special = pln_xcalloc((size_t)t->n_ids, sizeof *t->is_special);
    int rc = 0;
    for (size_t k = 0; k < l->nv && !rc; k++) {
        int64_t id = l->v_id[k];
        if (str_off[id] != SIZE_MAX)
            rc = pln_errorf("%s: model.vocab: id %lld used by both \"%s\" and \"%s\"", t->path, (long long)id,
                            (char *)l->arena.p + str_off[id], (char *)l->arena.p + l->v_off[k]);
        str_off[id] = l->v_off[k];
        t->tok_str_len[id] = l->v_len[k];
    }
    size_t na = json_array_size(added);
    t->added = pln_xcalloc(na ? na : 1, sizeof *t->added);
    json_array_foreach(added, i, val) {
        if (rc) break;
        json_t *c = json_object_get(val, "content");
        const char *cs = json_string_value(c);
        size_t cl = json_string_length(c);
        if (!tok_json_false(val, "single_word") || !tok_json_false(val, "lstrip") || !tok_json_false(val, "rstrip")) {
            rc = pln_errorf("%s: added_tokens[%zu] (\"%s\"): single_word/lstrip/rstrip are not supported (BLOOM has false)",
                            t->path, i, cs);
            break;
        }
        int64_t id = json_integer_value(json_object_get(val, "id"));
        if (str_off[id] == SIZE_MAX) {
            str_off[id] = tok_arena_put(&l->arena, cs, cl);
            t->tok_str_len[id] = (uint32_t)cl;
        } else if (t->tok_str_len[id] != cl || memcmp(l->arena.p + str_off[id], cs, cl) != 0) {
            rc = pln_errorf("%s: added_tokens[%zu]: id %lld is both \"%s\" and \"%s\"", t->path, i, (long long)id,
                            (char *)l->arena.p + str_off[id], cs);
            break;
        }
        tok_added *a = &t->added[t->n_added++];
        a->content = pln_xstrdup(cs);
        a->len = cl;
        a->id = (int32_t)id;
        a->special = !tok_json_false(val, "special");
        a->normalized = !tok_json_false(val, "normalized");
        t->is_special[id] = a->special;
        t->added_first_byte[a->normalized][(uint8_t)a->content[0]] = true;
    }
    if (rc) { free(str_off); return -1; }

    /* the arena is final: pointers, raw bytes (into a second arena), vocab hash */
    t->str_arena = (char *)l->arena.p;
    l->arena.p = NULL;
    t->tok_str = pln_xcalloc((size_t)t->n_ids, sizeof *t->tok_str);
    t->tok_bytes_off = pln_xmalloc((size_t)t->n_ids * sizeof *t->tok_bytes_off);
    t->tok_bytes_len = pln_xcalloc((size_t)t->n_ids, sizeof *t->tok_bytes_len);
    size_t total = 0;
    for (int64_t id = 0; id < t->n_ids; id++) if (str_off[id] != SIZE_MAX) total += t->tok_str_len[id] + 1;
    t->bytes_arena = pln_xmalloc(total ? total : 1);
    size_t bo = 0;
    for (int64_t id = 0; id < t->n_ids; id++) {
        t->tok_bytes_off[id] = UINT64_MAX;
        if (str_off[id] == SIZE_MAX) continue;
        t->tok_str[id] = t->str_arena + str_off[id];
        uint32_t bl = tok_string_bytes(t->tok_str[id], t->tok_str_len[id], byte_of_cp, t->bytes_arena + bo);
        t->tok_bytes_off[id] = bo;
        t->tok_bytes_len[id] = bl;
        bo += bl + 1;
        if (bl > t->max_token_bytes) t->max_token_bytes = bl;
    }
    free(str_off);
    size_t vcap = tok_pow2_at_least(l->nv * 2 + 1);
    t->vocab_slots = pln_xmalloc(vcap * sizeof *t->vocab_slots);
    memset(t->vocab_slots, 0xFF, vcap * sizeof *t->vocab_slots);
    t->vocab_mask = vcap - 1;
    for (size_t k = 0; k < l->nv; k++) {
        int32_t id = (int32_t)l->v_id[k];
        const char *key = t->tok_str[id];
        uint64_t hh = tok_hash_bytes(key, l->v_len[k]);
        uint32_t fp = (uint32_t)(hh >> 32);
        size_t h = hh & t->vocab_mask;
        while (t->vocab_slots[h] != UINT64_MAX) {
            uint64_t e = t->vocab_slots[h];
            int32_t o = (int32_t)(uint32_t)e;
            if ((uint32_t)(e >> 32) == fp && t->tok_str_len[o] == l->v_len[k] && memcmp(t->tok_str[o], key, l->v_len[k]) == 0)
                return pln_errorf("%s: model.vocab: \"%s\" appears twice (ids %d and %d)", t->path, key, o, id);
            h = (h + 1) & t->vocab_mask;
        }
        t->vocab_slots[h] = ((uint64_t)fp << 32) | (uint32_t)id;
    }

    uint32_t cp_of_byte[256];
    tok_byte_map(cp_of_byte);
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        int ul = tok_utf8_put(cp_of_byte[b], u);
        t->byte_id[b] = tok_vocab_find(t, (const char *)u, (size_t)ul);
    }
    t->unk_id = -1;
    json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk)) {
        t->unk_id = tok_vocab_find(t, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0) return pln_errorf("%s: model.unk_token \"%s\" is not in model.vocab", t->path, json_string_value(unk));
    }

    /* merges: rank = position; the merged token must be in the vocabulary */
    size_t pcap = tok_pow2_at_least(l->nm * 2 + 1);
    t->pairs = pln_xmalloc(pcap * sizeof *t->pairs);
    for (size_t k = 0; k < pcap; k++) t->pairs[k].key = UINT64_MAX;
    t->pair_mask = pcap - 1;
    /* merge strings are "a\0b\0" in the arena t now owns */
    char *cat = NULL;
    size_t cat_cap = 0;
    for (size_t k = 0; k < l->nm; k++) {
        const char *a = t->str_arena + l->m_off[k];
        size_t la = l->m_la[k], lb = l->m_lb[k];
        const char *b = a + la + 1;
        if (la + lb + 1 > cat_cap) { cat_cap = (la + lb + 1) * 2; cat = pln_xrealloc(cat, cat_cap); }
        memcpy(cat, a, la); memcpy(cat + la, b, lb); cat[la + lb] = 0;
        int32_t ia = tok_vocab_find(t, a, la), ib = tok_vocab_find(t, b, lb), in = tok_vocab_find(t, cat, la + lb);
        if (ia < 0 || ib < 0 || in < 0) {
            pln_errorf("%s: model.merges[%zu] (\"%s\" + \"%s\"): %s is not in model.vocab", t->path, k, a, b,
                       ia < 0 ? "the left token" : ib < 0 ? "the right token" : "the merged token");
            free(cat);
            return -1;
        }
        tok_pair_put(t, ia, ib, (uint32_t)k, in);
    }
    free(cat);
    return 0;
}

pln_tokenizer *pln_tok_load(const char *path) {
    size_t len;
    char *text = pln_read_small_file(path, TOK_MAX_FILE_BYTES, &len);
    if (!text) return NULL;
    tok_lists lists = {0};
    size_t rng[2][2];
    json_t *root;
    json_error_t jerr;
    if (tok_fast_scan(text, len, &lists, rng) == 0) {
        /* the rest of the document, with the two big values blanked out, goes to jansson */
        int first = rng[0][0] < rng[1][0] ? 0 : 1, second = 1 - first;
        tok_buf rest = {0};
        tok_buf_put(&rest, text, rng[first][0]);
        tok_buf_put(&rest, first == 0 ? "{}" : "[]", 2);
        tok_buf_put(&rest, text + rng[first][1], rng[second][0] - rng[first][1]);
        tok_buf_put(&rest, second == 0 ? "{}" : "[]", 2);
        tok_buf_put(&rest, text + rng[second][1], len - rng[second][1]);
        root = json_loadb((const char *)rest.p, rest.n, 0, &jerr);
        free(rest.p);
    } else {
        tok_lists_free(&lists);
        root = json_loadb(text, len, 0, &jerr);
    }
    free(text);
    if (!root) {
        tok_lists_free(&lists);
        pln_errorf("%s: not valid JSON (line %d, column %d): %s", path, jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    pln_tokenizer *t = pln_xcalloc(1, sizeof *t);
    t->path = pln_xstrdup(path);
    pthread_mutex_init(&t->cache_mu, NULL);
    int16_t byte_of_cp[324];
    uint32_t cp_of_byte[256];
    tok_byte_map(cp_of_byte);
    for (int c = 0; c < 324; c++) byte_of_cp[c] = -1;
    for (int b = 0; b < 256; b++) byte_of_cp[cp_of_byte[b]] = (int16_t)b;
    int rc = json_is_object(root) ? 0 : pln_errorf("%s: top level is not an object", path);
    if (!rc) rc = tok_load_pipeline(t, root);
    if (!rc) rc = tok_load_model(t, root, &lists, byte_of_cp);
    tok_lists_free(&lists);
    json_decref(root);
    if (rc) { pln_tok_free(t); return NULL; }
    return t;
}

void pln_tok_free(pln_tokenizer *t) {
    if (!t) return;
    free(t->str_arena); free(t->bytes_arena);
    free(t->tok_str); free(t->tok_str_len); free(t->tok_bytes_off); free(t->tok_bytes_len); free(t->is_special);
    free(t->vocab_slots);
    free(t->pairs);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    if (t->re) pcre2_code_free(t->re);
    if (t->cache) {
        for (size_t i = 0; i < TOK_CACHE_SLOTS; i++) { free(t->cache[i].key); free(t->cache[i].ids); }
        free(t->cache);
    }
    pthread_mutex_destroy(&t->cache_mu);
    free(t->path);
    free(t);
}

int64_t pln_tok_vocab_size(const pln_tokenizer *t) { return t->n_ids; }

const uint8_t *pln_tok_token_bytes(const pln_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || t->tok_bytes_off[id] == UINT64_MAX) { if (len) *len = 0; return NULL; }
    if (len) *len = t->tok_bytes_len[id];
    return t->bytes_arena + t->tok_bytes_off[id];
}

bool pln_tok_is_special(const pln_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->is_special[id];
}

int32_t pln_tok_token_id(const pln_tokenizer *t, const char *s) {
    for (int i = 0; i < t->n_added; i++)
        if (strcmp(t->added[i].content, s) == 0) return t->added[i].id;
    return tok_vocab_find(t, s, strlen(s));
}

size_t pln_tok_max_token_bytes(const pln_tokenizer *t) { return t->max_token_bytes; }

/* ---- encode ------------------------------------------------------------------------------ */

/* Scratch for one encode call (never shared between threads). */
typedef struct {
    int32_t *ids; size_t n, cap;        /* output */
    /* BPE symbols: a doubly linked list over the piece's bytes */
    int32_t *sym_id, *sym_prev, *sym_next;
    uint32_t *sym_len;
    size_t sym_cap;
    /* merge candidates: a binary heap ordered by (rank, position) */
    struct tok_merge { uint32_t rank; int32_t pos; int32_t new_id; } *heap;
    size_t heap_n, heap_cap;
    pcre2_match_data *md;
} tok_work;

static void tok_out(tok_work *w, int32_t id) {
    if (w->n == w->cap) { w->cap = w->cap ? w->cap * 2 : 64; w->ids = pln_xrealloc(w->ids, w->cap * sizeof *w->ids); }
    w->ids[w->n++] = id;
}

static bool tok_merge_less(const struct tok_merge *a, const struct tok_merge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void tok_heap_push(tok_work *w, uint32_t rank, int32_t pos, int32_t new_id) {
    if (w->heap_n == w->heap_cap) {
        w->heap_cap = w->heap_cap ? w->heap_cap * 2 : 64;
        w->heap = pln_xrealloc(w->heap, w->heap_cap * sizeof *w->heap);
    }
    struct tok_merge m = {rank, pos, new_id};
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tok_merge_less(&m, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = m;
}

static struct tok_merge tok_heap_pop(tok_work *w) {
    struct tok_merge top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && tok_merge_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!tok_merge_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static void tok_try_pair(const pln_tokenizer *t, tok_work *w, int32_t pos) {
    int32_t nx = w->sym_next[pos];
    if (nx < 0) return;
    uint32_t rank; int32_t new_id;
    if (tok_pair_find(t, w->sym_id[pos], w->sym_id[nx], &rank, &new_id)) tok_heap_push(w, rank, pos, new_id);
}

/* BPE over one piece's bytes, appending its ids to w->ids (HF's Word::merge_all). */
static void tok_bpe(const pln_tokenizer *t, tok_work *w, const uint8_t *s, size_t n) {
    if (t->ignore_merges) {
        /* the piece as one token if the vocabulary has it (ByteLevel spelling) */
        uint32_t cp_of_byte[256];
        tok_byte_map(cp_of_byte);
        char stackbuf[256];
        if (n * 2 < sizeof stackbuf) {
            size_t l = 0;
            for (size_t i = 0; i < n; i++) l += (size_t)tok_utf8_put(cp_of_byte[s[i]], (uint8_t *)stackbuf + l);
            int32_t id = tok_vocab_find(t, stackbuf, l);
            if (id >= 0) { tok_out(w, id); return; }
        }
    }
    if (n > w->sym_cap) {
        w->sym_cap = n * 2;
        w->sym_id = pln_xrealloc(w->sym_id, w->sym_cap * sizeof *w->sym_id);
        w->sym_prev = pln_xrealloc(w->sym_prev, w->sym_cap * sizeof *w->sym_prev);
        w->sym_next = pln_xrealloc(w->sym_next, w->sym_cap * sizeof *w->sym_next);
        w->sym_len = pln_xrealloc(w->sym_len, w->sym_cap * sizeof *w->sym_len);
    }
    /* initial symbols: one per byte; bytes missing from the vocabulary become unk (fused when
     * fuse_unk) or vanish when there is no unk token — HF's behaviour */
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id < 0) {
            if (t->unk_id < 0) continue;
            if (t->fuse_unk && m > 0 && w->sym_id[m - 1] == t->unk_id) { w->sym_len[m - 1]++; continue; }
            id = t->unk_id;
        }
        w->sym_id[m] = id; w->sym_len[m] = 1;
        w->sym_prev[m] = m - 1; w->sym_next[m] = m + 1;
        m++;
    }
    if (m == 0) return;
    w->sym_next[m - 1] = -1;
    w->heap_n = 0;
    for (int32_t i = 0; i + 1 < m; i++) tok_try_pair(t, w, i);
    while (w->heap_n) {
        struct tok_merge top = tok_heap_pop(w);
        int32_t p = top.pos;
        if (w->sym_len[p] == 0) continue;              /* merged into its left neighbour */
        int32_t nx = w->sym_next[p];
        if (nx < 0) continue;
        uint32_t rank; int32_t new_id;
        if (!tok_pair_find(t, w->sym_id[p], w->sym_id[nx], &rank, &new_id) || new_id != top.new_id) continue;
        /* merge nx into p */
        w->sym_id[p] = new_id;
        w->sym_len[p] += w->sym_len[nx];
        w->sym_len[nx] = 0;
        w->sym_next[p] = w->sym_next[nx];
        if (w->sym_next[nx] >= 0) w->sym_prev[w->sym_next[nx]] = p;
        if (w->sym_prev[p] >= 0) tok_try_pair(t, w, w->sym_prev[p]);
        tok_try_pair(t, w, p);
    }
    for (int32_t i = 0; i >= 0; i = w->sym_next[i]) tok_out(w, w->sym_id[i]);
}

/* BPE of one piece through the word cache. */
static void tok_piece(const pln_tokenizer *t, tok_work *w, const uint8_t *s, size_t n) {
    if (n == 0) return;
    if (n > TOK_CACHE_MAX_PIECE) { tok_bpe(t, w, s, n); return; }
    pln_tokenizer *mt = (pln_tokenizer *)t;   /* the cache is the only mutable state; locked */
    size_t slot = tok_hash_bytes(s, n) & (TOK_CACHE_SLOTS - 1);
    pthread_mutex_lock(&mt->cache_mu);
    if (mt->cache) {
        tok_cache_slot *c = &mt->cache[slot];
        if (c->key && c->key_len == n && memcmp(c->key, s, n) == 0) {
            for (int32_t i = 0; i < c->n_ids; i++) tok_out(w, c->ids[i]);
            pthread_mutex_unlock(&mt->cache_mu);
            return;
        }
    }
    pthread_mutex_unlock(&mt->cache_mu);
    size_t start = w->n;
    tok_bpe(t, w, s, n);
    /* direct-mapped: a new word replaces whatever held its slot */
    pthread_mutex_lock(&mt->cache_mu);
    if (!mt->cache) mt->cache = pln_xcalloc(TOK_CACHE_SLOTS, sizeof *mt->cache);
    tok_cache_slot *c = &mt->cache[slot];
    c->key = pln_xrealloc(c->key, n);
    memcpy(c->key, s, n);
    c->key_len = n;
    c->n_ids = (int32_t)(w->n - start);
    c->ids = pln_xrealloc(c->ids, (size_t)(c->n_ids ? c->n_ids : 1) * sizeof *c->ids);
    memcpy(c->ids, w->ids + start, (size_t)c->n_ids * sizeof *c->ids);
    pthread_mutex_unlock(&mt->cache_mu);
}

/* Split-Isolated over one segment of text without added tokens: matches and the gaps between
 * them are pieces; empty pieces are dropped (as HF's NormalizedString::split). */
static int tok_split_segment(const pln_tokenizer *t, tok_work *w, const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    if (!t->re) { tok_piece(t, w, s, n); return 0; }
    size_t pos = 0, gap = 0;
    while (pos <= n) {
        int rc = pcre2_match(t->re, s, n, pos, PCRE2_NO_UTF_CHECK, w->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return pln_errorf("%s: pre_tokenizer regex failed at byte %zu: %s", t->path, pos, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        size_t ms = ov[0], me = ov[1];
        if (ms > gap) tok_piece(t, w, s + gap, ms - gap);
        if (me > ms) { tok_piece(t, w, s + ms, me - ms); gap = me; pos = me; }
        else {                                   /* empty match: step one character */
            if (ms >= n) break;
            gap = ms;
            pos = ms + tok_utf8_len(s + ms, n - ms);
        }
    }
    if (gap < n) tok_piece(t, w, s + gap, n - gap);
    return 0;
}

/* Finds added tokens of one pass (normalized or not) in s[0..n) leftmost-longest; text between
 * them goes to the next pass (or to the split when this is the last). */
static int tok_encode_added(const pln_tokenizer *t, tok_work *w, const uint8_t *s, size_t n, int pass) {
    if (pass == 2) return tok_split_segment(t, w, s, n);
    size_t gap = 0;
    for (size_t i = 0; i < n; i++) {
        if (!t->added_first_byte[pass][s[i]]) continue;
        int best = -1;
        for (int k = 0; k < t->n_added; k++) {
            const tok_added *a = &t->added[k];
            if (a->normalized != (pass == 1) || a->len > n - i || memcmp(a->content, s + i, a->len) != 0) continue;
            if (best < 0 || a->len > t->added[best].len) best = k;
        }
        if (best < 0) continue;
        if (tok_encode_added(t, w, s + gap, i - gap, pass + 1)) return -1;
        tok_out(w, t->added[best].id);
        i += t->added[best].len - 1;
        gap = i + 1;
    }
    return tok_encode_added(t, w, s + gap, n - gap, pass + 1);
}

int pln_tok_encode(const pln_tokenizer *t, const char *text, size_t len, int32_t **ids_out, size_t *n_out) {
    *ids_out = NULL;
    *n_out = 0;
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < len;) {
        if (s[i] < 0x80) { i++; continue; }
        size_t l = tok_utf8_len(s + i, len - i);
        if (!l) return pln_errorf("%s: input text is not valid UTF-8 (byte 0x%02x at offset %zu); send UTF-8 text",
                                  t->path, s[i], i);
        i += l;
    }
    tok_work w = {0};
    if (t->re) w.md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (t->re && !w.md) return pln_errorf("%s: out of memory for regex match data", t->path);
    int rc = tok_encode_added(t, &w, s, len, 0);
    if (w.md) pcre2_match_data_free(w.md);
    free(w.sym_id); free(w.sym_prev); free(w.sym_next); free(w.sym_len); free(w.heap);
    if (rc) { free(w.ids); return -1; }
    if (w.n == 0) { free(w.ids); return 0; }
    *ids_out = w.ids;
    *n_out = w.n;
    return 0;
}

/* ---- decode ------------------------------------------------------------------------------ */

/* Expected length of a sequence starting with lead byte c (0: invalid lead), and the allowed
 * range of its second byte — the same table Rust's from_utf8_lossy uses. */
static int tok_lead(uint8_t c, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80; *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) { if (c == 0xE0) *lo = 0xA0; if (c == 0xED) *hi = 0x9F; return 3; }
    if (c >= 0xF0 && c <= 0xF4) { if (c == 0xF0) *lo = 0x90; if (c == 0xF4) *hi = 0x8F; return 4; }
    return 0;
}

static const char tok_fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Feeds one byte; appends complete output to out (bounded by cap). Returns bytes written. */
static size_t tok_stream_byte(pln_tok_stream *s, uint8_t c, char *out, size_t cap) {
    size_t o = 0;
    for (;;) {
        if (s->n_pend == 0) {
            uint8_t lo, hi;
            int need = tok_lead(c, &lo, &hi);
            if (need == 1) { if (o < cap) out[o++] = (char)c; return o; }
            if (need == 0) { if (o + 3 <= cap) { memcpy(out + o, tok_fffd, 3); o += 3; } return o; }
            s->pend[s->n_pend++] = c;
            return o;
        }
        uint8_t lo, hi;
        int need = tok_lead(s->pend[0], &lo, &hi);
        if (s->n_pend > 1) { lo = 0x80; hi = 0xBF; }
        if (c >= lo && c <= hi) {
            s->pend[s->n_pend++] = c;
            if (s->n_pend == need) {
                if (o + (size_t)need <= cap) { memcpy(out + o, s->pend, (size_t)need); o += (size_t)need; }
                s->n_pend = 0;
            }
            return o;
        }
        /* the pending prefix is a maximal invalid subsequence: one U+FFFD, then c starts afresh */
        if (o + 3 <= cap) { memcpy(out + o, tok_fffd, 3); o += 3; }
        s->n_pend = 0;
    }
}

size_t pln_tok_stream_push(const pln_tokenizer *t, pln_tok_stream *s, int32_t id, bool skip_special,
                           char *out, size_t cap) {
    if (id < 0 || id >= t->n_ids || t->tok_bytes_off[id] == UINT64_MAX) return 0;
    if (skip_special && t->is_special[id]) return 0;
    size_t o = 0;
    const uint8_t *b = t->bytes_arena + t->tok_bytes_off[id];
    for (uint32_t i = 0; i < t->tok_bytes_len[id]; i++) o += tok_stream_byte(s, b[i], out + o, cap - o);
    return o;
}

size_t pln_tok_stream_flush(const pln_tokenizer *t, pln_tok_stream *s, char *out, size_t cap) {
    size_t o = 0;
    if (s->n_pend > 0 && cap >= 3) { memcpy(out, tok_fffd, 3); o = 3; }
    s->n_pend = 0;
    return o;
}

char *pln_tok_decode(const pln_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, size_t *len_out) {
    size_t total = 4;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n_ids) total += 3 * (size_t)t->tok_bytes_len[ids[i]];
    char *out = pln_xmalloc(total);
    pln_tok_stream st = {0};
    size_t o = 0;
    for (size_t i = 0; i < n; i++) o += pln_tok_stream_push(t, &st, ids[i], skip_special, out + o, total - o);
    o += pln_tok_stream_flush(t, &st, out + o, total - o);
    out[o] = 0;
    if (len_out) *len_out = o;
    return out;
}
