/* tokenizer.c — Hugging Face tokenizer.json (BPE model) with the `tokenizers` library's pipeline:
 * added tokens → normalizer → pre-tokenizer → BPE → post-processor, and the decoder chain back,
 * matching `tokenizers` id for id. Components not implemented are refused at load by name and
 * JSON path. See tokenizer.h for the contract and docs/ARCHITECTURE.md for the pipeline. */
#include "runtime/tokenizer.h"

#include "formats/common.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* tokenizer.json files larger than this are refused (BLOOM's is 14.5 MB). */
#define TOK_MAX_FILE_BYTES ((size_t)1 << 30)
/* Pieces at most this long are remembered in the word cache (direct-mapped: a new piece replaces
 * whatever held its slot). */
#define TOK_CACHE_MAX_PIECE 64
#define TOK_CACHE_SLOTS (1u << 16)
/* Largest vocabulary accepted (BLOOM has 250680 ids). */
#define TOK_MAX_IDS (1 << 24)
/* Pipeline bounds: stages after flattening Sequences (real files use at most 4). */
#define TOK_MAX_NORM 16
#define TOK_MAX_PRE 16
#define TOK_MAX_DEC 16
#define TOK_MAX_POST 16

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
    if (n == 0) return;
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        b->p = pln_xrealloc(b->p, c);
        b->cap = c;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}


/* Decodes the code point of the valid UTF-8 sequence of length l at s. */
static uint32_t tok_utf8_cp(const uint8_t *s, size_t l) {
    if (l == 1) return s[0];
    if (l == 2) return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    if (l == 3) return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

/* Rust's char::is_whitespace (Unicode White_Space). */
static bool tok_is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- the tokenizer ---------------------------------------------------------------------- */

typedef struct {
    char *content;          /* the token's text (decode, pln_tok_token_id) */
    size_t len;
    char *match;            /* what is matched: content, or content normalized when normalized */
    size_t match_len;
    int32_t id;
    bool special;
    bool normalized;        /* matched in the second pass, on normalized text */
    bool lstrip, rstrip, single_word;
} tok_added;

/* One remembered piece → ids (word cache entry). */
typedef struct {
    uint8_t *key;           /* NULL = empty slot */
    size_t key_len;
    int32_t *ids;
    int32_t n_ids;
} tok_cache_slot;

/* Normalizers (Sequence flattened). */
enum { TN_PREPEND, TN_REPLACE, TN_NFC, TN_NFD, TN_NFKC, TN_NFKD, TN_LOWERCASE, TN_STRIP, TN_STRIP_ACCENTS };
typedef struct {
    int kind;
    char *str;              /* Prepend text, Replace content */
    size_t str_len;
    pcre2_code *re;         /* Replace pattern */
    bool left, right;       /* Strip */
} tok_norm;

/* Pre-tokenizer stages (Sequence flattened; ByteLevel becomes prefix-space, split and map
 * stages; Digits, Punctuation, Whitespace and WhitespaceSplit become splits with their own
 * patterns). */
enum { TP_SPLIT, TP_PREFIX_SPACE, TP_BYTES_TO_CHARS, TP_METASPACE };
enum { TB_REMOVED, TB_ISOLATED, TB_MERGED_PREV, TB_MERGED_NEXT, TB_CONTIGUOUS };
typedef struct {
    int kind;
    pcre2_code *re;         /* Split pattern (Metaspace: its replacement, when split) */
    int behavior;
    bool invert;
    uint8_t repl[4];        /* Metaspace replacement character */
    int repl_len;
    int prepend;            /* Metaspace prepend_scheme: 0 never, 1 first, 2 always */
} tok_pre;

/* Decoder stages (Sequence flattened). */
enum { TD_REPLACE, TD_BYTE_FALLBACK, TD_FUSE, TD_STRIP, TD_METASPACE, TD_BYTE_LEVEL };
typedef struct {
    int kind;
    pcre2_code *re;         /* Replace pattern */
    char *str;              /* Replace content */
    size_t str_len;
    uint8_t ch[4];          /* Strip content, Metaspace replacement */
    int ch_len;
    int start, stop;        /* Strip */
    bool prepend;           /* Metaspace: prepend_scheme is not never */
    bool fused;             /* a Fuse or ByteLevel comes before this stage */
} tok_dec;

struct pln_tokenizer {
    char *path;
    int64_t n_ids;                 /* vocab size: 1 + largest id */
    /* id → token string (tokenizer.json spelling) and decoded bytes; NULL for unused ids. */
    char **tok_str;                /* into str_arena */
    uint32_t *tok_str_len;
    uint64_t *tok_bytes_off;       /* into bytes_arena; UINT64_MAX = unused id */
    uint32_t *tok_bytes_len;
    char *str_arena;
    uint8_t *bytes_arena;
    bool *is_special;
    bool *is_byte;                 /* a ByteFallback <0xHH> token (decoder has ByteFallback) */
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
    /* byte → id of "<0xHH>" (-1 if absent), for byte_fallback */
    int32_t fallback_id[256];
    int32_t unk_id;                /* -1 if none */
    bool fuse_unk, ignore_merges, byte_fallback;
    char *cont_prefix, *word_suffix;   /* continuing_subword_prefix, end_of_word_suffix (NULL: none) */
    size_t cont_prefix_len, word_suffix_len;
    /* true when the last pre-tokenizer stage is ByteLevel's byte→char map and the model can
     * start from bytes: pieces reach BPE as raw bytes and byte_id gives their first symbols */
    bool bytes_model;
    /* added tokens: first pass (non-normalized), second pass (normalized) */
    tok_added *added;
    int n_added;
    bool added_first_byte[2][256];
    bool any_added[2];
    /* pipeline */
    tok_norm norm[TOK_MAX_NORM];
    int n_norm;
    tok_pre pre[TOK_MAX_PRE];
    int n_pre;
    tok_dec dec[TOK_MAX_DEC];
    int n_dec;
    bool no_decoder;               /* decoder null: tokens joined with " " */
    bool dec_byte_level, dec_byte_fallback, dec_first_differs;
    uint8_t strip_ch[4];           /* a Strip after Fuse: leading characters of the whole text */
    int strip_ch_len, strip_n;
    /* post-processor (add_special): ids before and after the sequence */
    int32_t *post_pre, *post_post;
    size_t n_post_pre, n_post_post;
    pcre2_code *word_re;           /* \w (Rust regex) for single_word */
    /* word cache */
    pthread_mutex_t cache_mu;
    tok_cache_slot *cache;
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
static char *tok_onig_to_pcre2(const char *pat, const char *path, const char *where) {
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
    pln_errorf("%s: %s pattern \"%s\" uses a regex construct pollen does not translate "
               "(negated nested class, &&, \\S in a class, or an unclosed class)", path, where, pat);
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

/* A boolean field with a default when absent or null. */
static bool tok_json_bool(json_t *o, const char *key, bool dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* ---- the pipeline: normalizer, pre-tokenizer, post-processor, decoder -------------------- */

/* Whitespace (Rust's char::is_whitespace and Oniguruma's \s) and word characters (Rust regex's
 * Unicode \w), spelled out so PCRE2 means the same sets. */
#define TOK_WS_CLASS "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define TOK_WORD_CLASS "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}"

static pcre2_code *tok_compile(pln_tokenizer *t, const char *src, uint32_t opts, const char *where) {
    int ec;
    PCRE2_SIZE eo;
    /* PCRE2_LITERAL takes no UCP (there are no classes to widen) */
    opts |= PCRE2_UTF | ((opts & PCRE2_LITERAL) ? 0 : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        pln_errorf("%s: %s pattern does not compile (as PCRE2 \"%s\", offset %zu): %s", t->path, where, src,
                   (size_t)eo, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   /* falls back to the interpreter on failure */
    return re;
}

/* A pattern object {"Regex": "..."} (Oniguruma syntax, translated) or {"String": "..."}. */
static pcre2_code *tok_load_pattern(pln_tokenizer *t, json_t *pat, const char *where) {
    json_t *rx = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
    json_t *lit = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
    if (json_is_string(rx)) {
        char *src = tok_onig_to_pcre2(json_string_value(rx), t->path, where);
        if (!src) return NULL;
        pcre2_code *re = tok_compile(t, src, 0, where);
        free(src);
        return re;
    }
    if (json_is_string(lit)) {
        if (json_string_length(lit) == 0) {
            pln_errorf("%s: %s.pattern is an empty string", t->path, where);
            return NULL;
        }
        return tok_compile(t, json_string_value(lit), PCRE2_LITERAL, where);
    }
    pln_errorf("%s: %s has no pattern.Regex or pattern.String", t->path, where);
    return NULL;
}

/* One character (a JSON string holding exactly one code point) into out; its length, or -1. */
static int tok_json_char(json_t *v, uint8_t out[4]) {
    if (!json_is_string(v)) return -1;
    const uint8_t *s = (const uint8_t *)json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0 || n > 4 || tok_utf8_len(s, n) != n) return -1;
    memcpy(out, s, n);
    return (int)n;
}

static int tok_load_norm(pln_tokenizer *t, json_t *n, const char *where) {
    if (!n || json_is_null(n)) return 0;
    const char *ty = tok_json_type(n);
    if (!ty) return pln_errorf("%s: %s has no \"type\"", t->path, where);
    if (strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(n, "normalizers");
        if (!json_is_array(arr)) return pln_errorf("%s: %s.normalizers is not an array", t->path, where);
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", where, i);
            if (tok_load_norm(t, v, sub)) return -1;
        }
        return 0;
    }
    if (t->n_norm == TOK_MAX_NORM) return pln_errorf("%s: %s: more than %d normalizers", t->path, where, TOK_MAX_NORM);
    tok_norm *d = &t->norm[t->n_norm];
    memset(d, 0, sizeof *d);
    if (strcmp(ty, "Prepend") == 0) {
        json_t *p = json_object_get(n, "prepend");
        if (!json_is_string(p)) return pln_errorf("%s: %s (Prepend): \"prepend\" is not a string", t->path, where);
        d->kind = TN_PREPEND;
        d->str = pln_xstrdup(json_string_value(p));
        d->str_len = json_string_length(p);
    } else if (strcmp(ty, "Replace") == 0) {
        json_t *c = json_object_get(n, "content");
        if (!json_is_string(c)) return pln_errorf("%s: %s (Replace): \"content\" is not a string", t->path, where);
        char w[300];
        snprintf(w, sizeof w, "%s (normalizer Replace)", where);
        if (!(d->re = tok_load_pattern(t, json_object_get(n, "pattern"), w))) return -1;
        d->kind = TN_REPLACE;
        d->str = pln_xstrdup(json_string_value(c));
        d->str_len = json_string_length(c);
    } else if (strcmp(ty, "NFC") == 0) d->kind = TN_NFC;
    else if (strcmp(ty, "NFD") == 0) d->kind = TN_NFD;
    else if (strcmp(ty, "NFKC") == 0) d->kind = TN_NFKC;
    else if (strcmp(ty, "NFKD") == 0) d->kind = TN_NFKD;
    else if (strcmp(ty, "Lowercase") == 0) d->kind = TN_LOWERCASE;
    else if (strcmp(ty, "StripAccents") == 0) d->kind = TN_STRIP_ACCENTS;
    else if (strcmp(ty, "Strip") == 0) {
        d->kind = TN_STRIP;
        d->left = tok_json_bool(n, "strip_left", true);
        d->right = tok_json_bool(n, "strip_right", true);
    } else {
        return pln_errorf("%s: %s: normalizer \"%s\" is not supported by pollen (supported: Sequence, Prepend, "
                          "Replace, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents)", t->path, where, ty);
    }
    t->n_norm++;
    return 0;
}

static int tok_behavior(pln_tokenizer *t, json_t *o, const char *where, int dflt, int *out) {
    json_t *b = json_object_get(o, "behavior");
    if (!b || json_is_null(b)) { *out = dflt; return 0; }
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (json_is_string(b) && strcmp(json_string_value(b), names[i]) == 0) { *out = i; return 0; }
    return pln_errorf("%s: %s.behavior \"%s\" is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
                      "Contiguous", t->path, where, json_is_string(b) ? json_string_value(b) : "?");
}

static tok_pre *tok_pre_add(pln_tokenizer *t, const char *where, int kind) {
    if (t->n_pre == TOK_MAX_PRE) {
        pln_errorf("%s: %s: more than %d pre-tokenizer stages", t->path, where, TOK_MAX_PRE);
        return NULL;
    }
    tok_pre *p = &t->pre[t->n_pre++];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    return p;
}

/* A split stage with a pattern of pollen's own (Digits, Punctuation, Whitespace, ByteLevel). */
static int tok_pre_split(pln_tokenizer *t, const char *where, const char *src, int behavior, bool invert) {
    tok_pre *p = tok_pre_add(t, where, TP_SPLIT);
    if (!p || !(p->re = tok_compile(t, src, 0, where))) return -1;
    p->behavior = behavior;
    p->invert = invert;
    return 0;
}

static int tok_prepend_scheme(pln_tokenizer *t, json_t *o, const char *where, int *out) {
    json_t *ps = json_object_get(o, "prepend_scheme");
    *out = 2;
    if (json_is_string(ps)) {
        const char *s = json_string_value(ps);
        if (strcmp(s, "never") == 0) *out = 0;
        else if (strcmp(s, "first") == 0) *out = 1;
        else if (strcmp(s, "always") == 0) *out = 2;
        else return pln_errorf("%s: %s.prepend_scheme \"%s\" is not first, always or never", t->path, where, s);
    } else if (ps && !json_is_null(ps)) {
        return pln_errorf("%s: %s.prepend_scheme is not a string", t->path, where);
    }
    json_t *aps = json_object_get(o, "add_prefix_space");   /* older files */
    if (json_is_false(aps)) *out = 0;
    return 0;
}

static int tok_load_pre(pln_tokenizer *t, json_t *p, const char *where) {
    if (!p || json_is_null(p)) return 0;
    const char *ty = tok_json_type(p);
    if (!ty) return pln_errorf("%s: %s has no \"type\"", t->path, where);
    if (strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(p, "pretokenizers");
        if (!json_is_array(arr)) return pln_errorf("%s: %s.pretokenizers is not an array", t->path, where);
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", where, i);
            if (tok_load_pre(t, v, sub)) return -1;
        }
        return 0;
    }
    if (strcmp(ty, "Split") == 0) {
        int beh;
        if (tok_behavior(t, p, where, TB_ISOLATED, &beh)) return -1;
        char w[300];
        snprintf(w, sizeof w, "%s (pre_tokenizer Split)", where);
        pcre2_code *re = tok_load_pattern(t, json_object_get(p, "pattern"), w);
        if (!re) return -1;
        tok_pre *s = tok_pre_add(t, where, TP_SPLIT);
        if (!s) { pcre2_code_free(re); return -1; }
        s->re = re;
        s->behavior = beh;
        s->invert = !tok_json_false(p, "invert");
        return 0;
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        if (tok_json_bool(p, "add_prefix_space", true) && !tok_pre_add(t, where, TP_PREFIX_SPACE)) return -1;
        if (tok_json_bool(p, "use_regex", true)) {
            char *src = tok_onig_to_pcre2("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
                                          t->path, where);
            int rc = src ? tok_pre_split(t, where, src, TB_ISOLATED, false) : -1;
            free(src);
            if (rc) return -1;
        }
        return tok_pre_add(t, where, TP_BYTES_TO_CHARS) ? 0 : -1;
    }
    if (strcmp(ty, "Metaspace") == 0) {
        tok_pre *m = tok_pre_add(t, where, TP_METASPACE);
        if (!m) return -1;
        if ((m->repl_len = tok_json_char(json_object_get(p, "replacement"), m->repl)) < 0)
            return pln_errorf("%s: %s (Metaspace): \"replacement\" is not one character", t->path, where);
        if (tok_prepend_scheme(t, p, where, &m->prepend)) return -1;
        if (tok_json_bool(p, "split", true)) {
            char lit[5] = {0};
            memcpy(lit, m->repl, (size_t)m->repl_len);
            if (!(m->re = tok_compile(t, lit, PCRE2_LITERAL, where))) return -1;
        }
        return 0;
    }
    if (strcmp(ty, "Digits") == 0)
        return tok_pre_split(t, where, "\\p{N}", tok_json_false(p, "individual_digits") ? TB_CONTIGUOUS : TB_ISOLATED, false);
    if (strcmp(ty, "Punctuation") == 0) {
        int beh;
        if (tok_behavior(t, p, where, TB_ISOLATED, &beh)) return -1;
        return tok_pre_split(t, where, "[\\p{P}\\x21-\\x2F\\x3A-\\x40\\x5B-\\x60\\x7B-\\x7E]", beh, false);
    }
    if (strcmp(ty, "Whitespace") == 0)
        return tok_pre_split(t, where, "[" TOK_WORD_CLASS "]+|[^" TOK_WORD_CLASS TOK_WS_CLASS "]+", TB_REMOVED, true);
    if (strcmp(ty, "WhitespaceSplit") == 0)
        return tok_pre_split(t, where, "[" TOK_WS_CLASS "]", TB_REMOVED, false);
    return pln_errorf("%s: %s: pre_tokenizer \"%s\" is not supported by pollen (supported: Sequence, Split, ByteLevel, "
                      "Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit)", t->path, where, ty);
}

/* ids of a TemplateProcessing special token by name. */
static int tok_template_ids(pln_tokenizer *t, json_t *specials, const char *name, const char *where, int32_t **ids,
                            size_t *n) {
    json_t *st = json_object_get(specials, name);
    json_t *arr = json_object_get(st, "ids");
    if (!json_is_array(arr))
        return pln_errorf("%s: %s: special token \"%s\" has no entry with \"ids\" in special_tokens", t->path, where, name);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_IDS)
            return pln_errorf("%s: %s: special_tokens[\"%s\"].ids[%zu] is not a token id", t->path, where, name, i);
        *ids = pln_xrealloc(*ids, (*n + 1) * sizeof **ids);
        (*ids)[(*n)++] = (int32_t)json_integer_value(v);
    }
    return 0;
}

/* Wraps the current before/after ids with this processor's (a later processor wraps the result
 * of an earlier one). */
static void tok_post_wrap(pln_tokenizer *t, int32_t *pre, size_t npre, int32_t *post, size_t npost) {
    int32_t *np = pln_xmalloc((npre + t->n_post_pre + 1) * sizeof *np);
    if (npre) memcpy(np, pre, npre * sizeof *np);
    if (t->n_post_pre) memcpy(np + npre, t->post_pre, t->n_post_pre * sizeof *np);
    free(t->post_pre);
    t->post_pre = np;
    t->n_post_pre += npre;
    t->post_post = pln_xrealloc(t->post_post, (t->n_post_post + npost + 1) * sizeof *t->post_post);
    if (npost) memcpy(t->post_post + t->n_post_post, post, npost * sizeof *post);
    t->n_post_post += npost;
}

static int tok_load_post(pln_tokenizer *t, json_t *p, const char *where) {
    if (!p || json_is_null(p)) return 0;
    const char *ty = tok_json_type(p);
    if (!ty) return pln_errorf("%s: %s has no \"type\"", t->path, where);
    if (strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(p, "processors");
        if (!json_is_array(arr)) return pln_errorf("%s: %s.processors is not an array", t->path, where);
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", where, i);
            if (tok_load_post(t, v, sub)) return -1;
        }
        return 0;
    }
    if (strcmp(ty, "ByteLevel") == 0) return 0;     /* offsets only: no ids change */
    if (strcmp(ty, "TemplateProcessing") == 0) {
        json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
        if (!json_is_array(single)) return pln_errorf("%s: %s.single is not an array", t->path, where);
        int32_t *pre = NULL, *post = NULL;
        size_t npre = 0, npost = 0, i;
        bool seen_a = false;
        json_t *v;
        int rc = 0;
        json_array_foreach(single, i, v) {
            json_t *sp = json_object_get(v, "SpecialToken"), *sq = json_object_get(v, "Sequence");
            if (json_is_object(sp) && json_is_string(json_object_get(sp, "id"))) {
                rc = seen_a ? tok_template_ids(t, specials, json_string_value(json_object_get(sp, "id")), where, &post, &npost)
                            : tok_template_ids(t, specials, json_string_value(json_object_get(sp, "id")), where, &pre, &npre);
            } else if (json_is_object(sq) && json_is_string(json_object_get(sq, "id")) &&
                       strcmp(json_string_value(json_object_get(sq, "id")), "A") == 0 && !seen_a) {
                seen_a = true;
            } else {
                rc = pln_errorf("%s: %s.single[%zu] is neither a SpecialToken nor the one Sequence A", t->path, where, i);
            }
            if (rc) break;
        }
        if (!rc && !seen_a) rc = pln_errorf("%s: %s.single has no Sequence A", t->path, where);
        if (!rc) tok_post_wrap(t, pre, npre, post, npost);
        free(pre); free(post);
        return rc;
    }
    if (strcmp(ty, "RobertaProcessing") == 0 || strcmp(ty, "BertProcessing") == 0) {
        json_t *cls = json_object_get(p, "cls"), *sep = json_object_get(p, "sep");
        json_t *ci = json_array_get(cls, 1), *si = json_array_get(sep, 1);
        if (!json_is_integer(ci) || !json_is_integer(si) || json_integer_value(ci) < 0 || json_integer_value(si) < 0 ||
            json_integer_value(ci) >= TOK_MAX_IDS || json_integer_value(si) >= TOK_MAX_IDS)
            return pln_errorf("%s: %s (%s): cls/sep are not [token, id] pairs", t->path, where, ty);
        int32_t c = (int32_t)json_integer_value(ci), s = (int32_t)json_integer_value(si);
        tok_post_wrap(t, &c, 1, &s, 1);
        return 0;
    }
    return pln_errorf("%s: %s: post_processor \"%s\" is not supported by pollen (supported: Sequence, ByteLevel, "
                      "TemplateProcessing, RobertaProcessing, BertProcessing)", t->path, where, ty);
}

static int tok_load_dec(pln_tokenizer *t, json_t *d, const char *where, bool *fused) {
    const char *ty = tok_json_type(d);
    if (!ty) return pln_errorf("%s: %s has no \"type\"", t->path, where);
    if (strcmp(ty, "Sequence") == 0) {
        json_t *arr = json_object_get(d, "decoders");
        if (!json_is_array(arr)) return pln_errorf("%s: %s.decoders is not an array", t->path, where);
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", where, i);
            if (tok_load_dec(t, v, sub, fused)) return -1;
        }
        return 0;
    }
    if (t->n_dec == TOK_MAX_DEC) return pln_errorf("%s: %s: more than %d decoders", t->path, where, TOK_MAX_DEC);
    tok_dec *s = &t->dec[t->n_dec];
    memset(s, 0, sizeof *s);
    s->fused = *fused;
    if (strcmp(ty, "Replace") == 0) {
        json_t *c = json_object_get(d, "content"), *pat = json_object_get(d, "pattern");
        if (!json_is_string(c)) return pln_errorf("%s: %s (Replace): \"content\" is not a string", t->path, where);
        json_t *lit = json_object_get(pat, "String");
        /* after Fuse the text is one string: a pattern longer than one character could span
         * two tokens, which the per-token decode (and so streaming) cannot see */
        if (*fused && !(json_is_string(lit) && tok_json_char(lit, s->ch) > 0))
            return pln_errorf("%s: %s: a Replace decoder after Fuse/ByteLevel with a pattern longer than one character "
                              "is not supported by pollen", t->path, where);
        char w[300];
        snprintf(w, sizeof w, "%s (decoder Replace)", where);
        if (!(s->re = tok_load_pattern(t, pat, w))) return -1;
        s->kind = TD_REPLACE;
        s->str = pln_xstrdup(json_string_value(c));
        s->str_len = json_string_length(c);
    } else if (strcmp(ty, "ByteFallback") == 0) {
        s->kind = TD_BYTE_FALLBACK;
        t->dec_byte_fallback = true;
    } else if (strcmp(ty, "Fuse") == 0) {
        s->kind = TD_FUSE;
        *fused = true;
    } else if (strcmp(ty, "Strip") == 0) {
        s->kind = TD_STRIP;
        json_t *st = json_object_get(d, "start"), *sp = json_object_get(d, "stop");
        if ((s->ch_len = tok_json_char(json_object_get(d, "content"), s->ch)) < 0 || !json_is_integer(st) ||
            !json_is_integer(sp) || json_integer_value(st) < 0 || json_integer_value(sp) < 0 ||
            json_integer_value(st) > 64 || json_integer_value(sp) > 64)
            return pln_errorf("%s: %s (Strip): needs \"content\" (one character) and \"start\"/\"stop\" in [0, 64]",
                              t->path, where);
        s->start = (int)json_integer_value(st);
        s->stop = (int)json_integer_value(sp);
        if (*fused) {
            /* the whole text's ends: the start is streamed as a state, the end would need the
             * text's end before emitting anything */
            if (s->stop > 0)
                return pln_errorf("%s: %s: a Strip decoder after Fuse with stop > 0 is not supported by pollen "
                                  "(a stream cannot know the text's end)", t->path, where);
            if (t->strip_n > 0 && s->start > 0)
                return pln_errorf("%s: %s: a second Strip decoder after Fuse is not supported by pollen", t->path, where);
            if (s->start > 0) {
                memcpy(t->strip_ch, s->ch, 4);
                t->strip_ch_len = s->ch_len;
                t->strip_n = s->start;
            }
        }
    } else if (strcmp(ty, "Metaspace") == 0) {
        s->kind = TD_METASPACE;
        int scheme;
        if ((s->ch_len = tok_json_char(json_object_get(d, "replacement"), s->ch)) < 0)
            return pln_errorf("%s: %s (Metaspace): \"replacement\" is not one character", t->path, where);
        if (tok_prepend_scheme(t, d, where, &scheme)) return -1;
        s->prepend = scheme != 0;
        if (s->prepend && !*fused) t->dec_first_differs = true;
    } else if (strcmp(ty, "ByteLevel") == 0) {
        s->kind = TD_BYTE_LEVEL;
        t->dec_byte_level = true;
        *fused = true;
    } else {
        return pln_errorf("%s: %s: decoder \"%s\" is not supported by pollen (supported: Sequence, ByteLevel, "
                          "ByteFallback, Fuse, Strip, Replace, Metaspace)", t->path, where, ty);
    }
    t->n_dec++;
    return 0;
}

static int tok_load_pipeline(pln_tokenizer *t, json_t *root) {
    if (tok_load_norm(t, json_object_get(root, "normalizer"), "normalizer")) return -1;
    if (tok_load_pre(t, json_object_get(root, "pre_tokenizer"), "pre_tokenizer")) return -1;
    if (tok_load_post(t, json_object_get(root, "post_processor"), "post_processor")) return -1;
    json_t *dec = json_object_get(root, "decoder");
    bool fused = false;
    if (!dec || json_is_null(dec)) t->no_decoder = true;
    else if (tok_load_dec(t, dec, "decoder", &fused)) return -1;
    t->word_re = tok_compile(t, "[" TOK_WORD_CLASS "]", 0, "single_word");
    return t->word_re ? 0 : -1;
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
/* ---- encode ------------------------------------------------------------------------------ */

/* Scratch for one encode call (never shared between threads). */
typedef struct {
    int32_t *ids; size_t n, cap;        /* output */
    /* BPE symbols: a doubly linked list over the piece's characters */
    int32_t *sym_id, *sym_prev, *sym_next;
    uint32_t *sym_len;
    size_t sym_cap;
    /* merge candidates: a binary heap ordered by (rank, position) */
    struct tok_merge { uint32_t rank; int32_t pos; int32_t new_id; } *heap;
    size_t heap_n, heap_cap;
    pcre2_match_data *md;
    /* per pre-tokenizer depth: transformed text and the split's spans */
    tok_buf scratch[TOK_MAX_PRE + 1];
    struct tok_span { size_t s, e; bool m; } *spans[TOK_MAX_PRE + 1];
    pcre2_match_data *mds[TOK_MAX_PRE + 1];   /* stage k's pattern's match data */
    size_t span_cap[TOK_MAX_PRE + 1];
    tok_buf norm_a, norm_b, key;
    /* elementary steps done (symbols made, pair lookups, heap moves, ids out, regex calls and the
     * bytes they advance over): the deterministic cost that pln_tok_last_work reports */
    uint64_t work;
} tok_work;

static _Thread_local uint64_t tok_last_work;
uint64_t pln_tok_last_work(void) { return tok_last_work; }

static void tok_out(tok_work *w, int32_t id) {
    w->work++;
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
    w->work++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        w->work++;
        if (!tok_merge_less(&m, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = m;
}

static struct tok_merge tok_heap_pop(tok_work *w) {
    struct tok_merge top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    w->work++;
    for (;;) {
        size_t c = 2 * i + 1;
        w->work++;
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
    w->work++;
    if (nx < 0) return;
    uint32_t rank; int32_t new_id;
    if (tok_pair_find(t, w->sym_id[pos], w->sym_id[nx], &rank, &new_id)) tok_heap_push(w, rank, pos, new_id);
}

/* BPE over one piece's bytes, appending its ids to w->ids (HF's Word::merge_all). */
static void tok_sym_reserve(tok_work *w, size_t n) {
    if (n <= w->sym_cap) return;
    w->sym_cap = n * 2;
    w->sym_id = pln_xrealloc(w->sym_id, w->sym_cap * sizeof *w->sym_id);
    w->sym_prev = pln_xrealloc(w->sym_prev, w->sym_cap * sizeof *w->sym_prev);
    w->sym_next = pln_xrealloc(w->sym_next, w->sym_cap * sizeof *w->sym_next);
    w->sym_len = pln_xrealloc(w->sym_len, w->sym_cap * sizeof *w->sym_len);
}

static void tok_sym_add(tok_work *w, int32_t *m, int32_t id, uint32_t len) {
    w->work++;
    tok_sym_reserve(w, (size_t)*m + 1);
    w->sym_id[*m] = id; w->sym_len[*m] = len;
    w->sym_prev[*m] = *m - 1; w->sym_next[*m] = *m + 1;
    (*m)++;
}

/* First symbols of a piece that is text (not raw bytes): one per character, with
 * continuing_subword_prefix / end_of_word_suffix, byte_fallback and unk exactly as HF's
 * BPE::merge_word (a pending unk waits while byte-fallback tokens are added). */
static int32_t tok_symbols_chars(const pln_tokenizer *t, tok_work *w, const uint8_t *s, size_t n) {
    int32_t m = 0;
    int32_t unk_len = -1;              /* pending unk's byte length, -1 if none */
    for (size_t i = 0; i < n;) {
        size_t l = tok_utf8_len(s + i, n - i);
        if (!l) l = 1;                 /* cannot happen on validated text */
        bool first = i == 0, last = i + l == n;
        w->key.n = 0;
        if (!first && t->cont_prefix) tok_buf_put(&w->key, t->cont_prefix, t->cont_prefix_len);
        tok_buf_put(&w->key, s + i, l);
        if (last && t->word_suffix) tok_buf_put(&w->key, t->word_suffix, t->word_suffix_len);
        int32_t id = tok_vocab_find(t, (const char *)w->key.p, w->key.n);
        if (id >= 0) {
            if (unk_len >= 0) { tok_sym_add(w, &m, t->unk_id, (uint32_t)unk_len); unk_len = -1; }
            tok_sym_add(w, &m, id, (uint32_t)l);
        } else {
            bool done = false;
            if (t->byte_fallback) {
                done = true;
                for (size_t k = 0; k < w->key.n; k++) if (t->fallback_id[w->key.p[k]] < 0) done = false;
                if (done)
                    for (size_t k = 0; k < w->key.n; k++) tok_sym_add(w, &m, t->fallback_id[w->key.p[k]], 1);
            }
            if (!done && t->unk_id >= 0) {
                if (unk_len >= 0 && t->fuse_unk) unk_len += (int32_t)l;
                else {
                    if (unk_len >= 0) tok_sym_add(w, &m, t->unk_id, (uint32_t)unk_len);
                    unk_len = (int32_t)l;
                }
            }
        }
        i += l;
    }
    if (unk_len >= 0) tok_sym_add(w, &m, t->unk_id, (uint32_t)unk_len);
    return m;
}

/* First symbols of raw bytes under ByteLevel: one per byte; bytes missing from the vocabulary
 * become unk (fused when fuse_unk) or vanish when there is no unk token — HF's behaviour. */
static int32_t tok_symbols_bytes(const pln_tokenizer *t, tok_work *w, const uint8_t *s, size_t n) {
    tok_sym_reserve(w, n);
    int32_t m = 0;
    w->work += n;
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
    return m;
}

/* BPE over one piece, appending its ids to w->ids (HF's Word::merge_all). */
static void tok_bpe(const pln_tokenizer *t, tok_work *w, const uint8_t *s, size_t n) {
    if (t->ignore_merges) {
        /* the piece as one token if the vocabulary has it (ByteLevel spelling for raw bytes) */
        if (t->bytes_model) {
            uint32_t cp_of_byte[256];
            tok_byte_map(cp_of_byte);
            w->key.n = 0;
            for (size_t i = 0; i < n; i++) {
                uint8_t u[4];
                tok_buf_put(&w->key, u, (size_t)tok_utf8_put(cp_of_byte[s[i]], u));
            }
            int32_t id = tok_vocab_find(t, (const char *)w->key.p, w->key.n);
            if (id >= 0) { tok_out(w, id); return; }
        } else {
            int32_t id = tok_vocab_find(t, (const char *)s, n);
            if (id >= 0) { tok_out(w, id); return; }
        }
    }
    int32_t m = t->bytes_model ? tok_symbols_bytes(t, w, s, n) : tok_symbols_chars(t, w, s, n);
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


/* ---- normalizers ---- */

/* Replaces every match of re in s[0..n) by rep, into out (HF's NormalizedString::replace and
 * the Replace decoder; an empty match replaces nothing and steps one character). */
static int tok_replace(const pln_tokenizer *t, pcre2_code *re, pcre2_match_data *md, const uint8_t *s, size_t n,
                       const char *rep, size_t rep_len, tok_buf *out) {
    out->n = 0;
    size_t pos = 0, copied = 0;
    while (pos <= n) {
        int rc = pcre2_match(re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return pln_errorf("%s: Replace pattern failed at byte %zu (PCRE2 error %d)", t->path, pos, rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me > ms) {
            tok_buf_put(out, s + copied, ms - copied);
            tok_buf_put(out, rep, rep_len);
            copied = pos = me;
        } else {
            if (ms >= n) break;
            pos = ms + tok_utf8_len(s + ms, n - ms);
        }
    }
    tok_buf_put(out, s + copied, n - copied);
    return 0;
}

/* Runs the normalizers over s[0..n); the result is in *res (one of w's buffers, or s itself).
 * *start_kept (may be NULL): the result's first character still comes from s's first byte, as
 * HF's alignments say (false once a leading character was removed: Strip, StripAccents, a
 * Replace by nothing); Metaspace's prepend_scheme "first" asks this. */
static int tok_normalize(const pln_tokenizer *t, tok_work *w, const uint8_t *s, size_t n, const uint8_t **res,
                         size_t *res_n, bool *start_kept) {
    bool kept = true;
    const uint8_t *cur = s;
    size_t cn = n;
    tok_buf *bufs[2] = {&w->norm_a, &w->norm_b};
    int nb = 0;
    for (int k = 0; k < t->n_norm; k++) {
        const tok_norm *d = &t->norm[k];
        tok_buf *out = bufs[nb];
        out->n = 0;
        w->work += 1 + cn;
        switch (d->kind) {
        case TN_PREPEND:
            if (cn == 0) continue;
            tok_buf_put(out, d->str, d->str_len);
            tok_buf_put(out, cur, cn);
            break;
        case TN_REPLACE: {
            pcre2_match_data *md = pcre2_match_data_create_from_pattern(d->re, NULL);
            int rc = cn ? pcre2_match(d->re, cur, cn, 0, PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, md, NULL) : -1;
            if (rc >= 0 && d->str_len == 0 && pcre2_get_ovector_pointer(md)[1] > 0) kept = false;
            rc = tok_replace(t, d->re, md, cur, cn, d->str, d->str_len, out);
            pcre2_match_data_free(md);
            if (rc) return -1;
            break;
        }
        case TN_NFC: case TN_NFD: case TN_NFKC: case TN_NFKD: {
            size_t q = 0;
            while (q < cn && cur[q] < 0x80) q++;
            if (q == cn) continue;                  /* ASCII is the same in every normal form */
            int opt = UTF8PROC_STABLE | (d->kind == TN_NFC || d->kind == TN_NFKC ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                      (d->kind == TN_NFKC || d->kind == TN_NFKD ? UTF8PROC_COMPAT : 0);
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t r = utf8proc_map(cur, (utf8proc_ssize_t)cn, &dst, (utf8proc_option_t)opt);
            if (r < 0) return pln_errorf("%s: Unicode normalization failed: %s", t->path, utf8proc_errmsg(r));
            tok_buf_put(out, dst, (size_t)r);
            free(dst);
            break;
        }
        case TN_LOWERCASE:
        case TN_STRIP_ACCENTS:
            for (size_t i = 0; i < cn;) {
                size_t l = tok_utf8_len(cur + i, cn - i);
                uint32_t c = tok_utf8_cp(cur + i, l);
                uint8_t u[4];
                if (d->kind == TN_LOWERCASE) {
                    if (c == 0x130) tok_buf_put(out, "i\xCC\x87", 3);   /* the one two-character lowercase */
                    else tok_buf_put(out, u, (size_t)tok_utf8_put((uint32_t)utf8proc_tolower((utf8proc_int32_t)c), u));
                } else {
                    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
                    if (cat != UTF8PROC_CATEGORY_MN && cat != UTF8PROC_CATEGORY_MC && cat != UTF8PROC_CATEGORY_ME)
                        tok_buf_put(out, cur + i, l);
                    else if (out->n == 0)
                        kept = false;
                }
                i += l;
            }
            break;
        case TN_STRIP: {
            size_t a = 0, b = cn;
            if (d->left)
                while (a < b) {
                    size_t l = tok_utf8_len(cur + a, b - a);
                    if (!tok_is_ws(tok_utf8_cp(cur + a, l))) break;
                    a += l;
                }
            if (d->right)
                while (b > a) {
                    size_t p = b - 1;
                    while (p > a && (cur[p] & 0xC0) == 0x80) p--;
                    if (!tok_is_ws(tok_utf8_cp(cur + p, b - p))) break;
                    b = p;
                }
            tok_buf_put(out, cur + a, b - a);
            if (a > 0) kept = false;
            break;
        }
        }
        cur = out->p ? out->p : (const uint8_t *)"";
        cn = out->n;
        nb ^= 1;
    }
    *res = cur;
    *res_n = cn;
    if (start_kept) *start_kept = kept;
    return 0;
}

/* ---- pre-tokenizer ---- */

static int tok_pre_run(const pln_tokenizer *t, tok_work *w, int k, const uint8_t *s, size_t n, bool first);

static void tok_span_add(tok_work *w, int k, size_t *ns, size_t s, size_t e, bool m) {
    if (*ns == w->span_cap[k]) {
        w->span_cap[k] = w->span_cap[k] ? w->span_cap[k] * 2 : 64;
        w->spans[k] = pln_xrealloc(w->spans[k], w->span_cap[k] * sizeof *w->spans[k]);
    }
    w->spans[k][(*ns)++] = (struct tok_span){s, e, m};
}

/* HF's NormalizedString::split: the pattern's matches and the gaps between them (flags flipped
 * when inverted), combined by the behavior; each non-empty piece goes to stage k + 1. */
static int tok_split(const pln_tokenizer *t, tok_work *w, int k, const tok_pre *p, const uint8_t *s, size_t n,
                     bool first) {
    if (n == 0) return 0;
    size_t ns = 0, pos = 0, gap = 0;
    if (!w->mds[k] && !(w->mds[k] = pcre2_match_data_create_from_pattern(p->re, NULL)))
        return pln_errorf("%s: out of memory for regex match data", t->path);
    pcre2_match_data *md = w->mds[k];
    /* Isolated (BLOOM, Llama 3, Qwen2, ByteLevel's regex): every piece goes on as it is found */
    bool direct = p->behavior == TB_ISOLATED;
    while (pos <= n) {
        int rc = pcre2_match(p->re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return pln_errorf("%s: pre_tokenizer regex failed at byte %zu: %s", t->path, pos, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (direct) {
            if (ms > gap && tok_pre_run(t, w, k + 1, s + gap, ms - gap, first && gap == 0)) return -1;
            if (me > ms && tok_pre_run(t, w, k + 1, s + ms, me - ms, first && ms == 0)) return -1;
        } else {
            if (ms > gap) tok_span_add(w, k, &ns, gap, ms, false);
            tok_span_add(w, k, &ns, ms, me, true);
        }
        gap = me;
        size_t from = pos;
        if (me > ms) pos = me;
        else {                                   /* empty match: step one character */
            if (ms >= n) break;
            pos = ms + tok_utf8_len(s + ms, n - ms);
        }
        w->work += 1 + (pos - from);
    }
    if (direct) return gap < n ? tok_pre_run(t, w, k + 1, s + gap, n - gap, first && gap == 0) : 0;
    if (gap < n) tok_span_add(w, k, &ns, gap, n, false);
    struct tok_span *sp = w->spans[k];
    if (p->invert)
        for (size_t i = 0; i < ns; i++) sp[i].m = !sp[i].m;
    /* combine in place: out[] holds (span, removed) */
    size_t no = 0;
    bool prev_match = false;
    switch (p->behavior) {
    case TB_ISOLATED:
        for (size_t i = 0; i < ns; i++) sp[i].m = false;
        no = ns;
        break;
    case TB_REMOVED:
        no = ns;
        break;
    case TB_CONTIGUOUS:
        for (size_t i = 0; i < ns; i++) {
            bool m = sp[i].m;
            if (m == prev_match && no > 0) sp[no - 1].e = sp[i].e;
            else sp[no++] = (struct tok_span){sp[i].s, sp[i].e, false};
            prev_match = m;
        }
        break;
    case TB_MERGED_PREV:
        for (size_t i = 0; i < ns; i++) {
            bool m = sp[i].m;
            if (m && !prev_match && no > 0) sp[no - 1].e = sp[i].e;
            else sp[no++] = (struct tok_span){sp[i].s, sp[i].e, false};
            prev_match = m;
        }
        break;
    case TB_MERGED_NEXT: {
        /* walk backwards, merging a match into the piece after it, then reverse */
        size_t out = ns;                 /* results fill sp[out..ns) from the right */
        for (size_t i = ns; i-- > 0;) {
            bool m = sp[i].m;
            struct tok_span cur = sp[i];
            if (m && !prev_match && out < ns) sp[out].s = cur.s;
            else sp[--out] = (struct tok_span){cur.s, cur.e, false};
            prev_match = m;
        }
        memmove(sp, sp + out, (ns - out) * sizeof *sp);
        no = ns - out;
        break;
    }
    }
    /* stage k + 1 may reuse w->spans[k + 1] only: copy what we iterate over is not needed */
    for (size_t i = 0; i < no; i++) {
        struct tok_span x = w->spans[k][i];
        if (x.m || x.e == x.s) continue;
        if (tok_pre_run(t, w, k + 1, s + x.s, x.e - x.s, first && x.s == 0)) return -1;
    }
    return 0;
}

/* Stage k of the pre-tokenizer on one piece; past the last stage, the model. first: the piece
 * starts at offset 0 of the original text (Metaspace's prepend_scheme "first"). */
static int tok_pre_run(const pln_tokenizer *t, tok_work *w, int k, const uint8_t *s, size_t n, bool first) {
    if (n == 0) return 0;
    if (k == t->n_pre) { tok_piece(t, w, s, n); return 0; }
    const tok_pre *p = &t->pre[k];
    tok_buf *b = &w->scratch[k];
    switch (p->kind) {
    case TP_SPLIT:
        return tok_split(t, w, k, p, s, n, first);
    case TP_PREFIX_SPACE:
        if (s[0] == ' ') return tok_pre_run(t, w, k + 1, s, n, first);
        b->n = 0;
        tok_buf_put(b, " ", 1);
        tok_buf_put(b, s, n);
        return tok_pre_run(t, w, k + 1, b->p, b->n, first);
    case TP_BYTES_TO_CHARS: {
        uint32_t cp_of_byte[256];
        tok_byte_map(cp_of_byte);
        b->n = 0;
        for (size_t i = 0; i < n; i++) {
            uint8_t u[4];
            tok_buf_put(b, u, (size_t)tok_utf8_put(cp_of_byte[s[i]], u));
        }
        return tok_pre_run(t, w, k + 1, b->p, b->n, first);
    }
    case TP_METASPACE: {
        b->n = 0;
        size_t rl = (size_t)p->repl_len;
        /* after ' ' → replacement, does the piece start with the replacement? */
        bool starts = s[0] == ' ' || (n >= rl && memcmp(s, p->repl, rl) == 0);
        if ((p->prepend == 2 || (p->prepend == 1 && first)) && !starts) tok_buf_put(b, p->repl, rl);
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') tok_buf_put(b, p->repl, rl);
            else tok_buf_put(b, s + i, 1);
        }
        if (!p->re) return tok_pre_run(t, w, k + 1, b->p, b->n, first);
        tok_pre sp = *p;
        sp.behavior = TB_MERGED_NEXT;
        sp.invert = false;
        /* the split reads b while deeper stages use their own buffers */
        return tok_split(t, w, k, &sp, b->p, b->n, first);
    }
    }
    return 0;
}

/* ---- added tokens ---- */

/* Rust regex \w at the end of s[0..n) / at its start. */
static bool tok_word_at(const pln_tokenizer *t, const uint8_t *s, size_t n, bool at_end) {
    if (n == 0) return false;
    size_t p = 0;
    if (at_end) { p = n - 1; while (p > 0 && (s[p] & 0xC0) == 0x80) p--; }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->word_re, NULL);
    size_t l = tok_utf8_len(s + p, n - p);
    int rc = pcre2_match(t->word_re, s + p, l ? l : 1, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

/* The text between added tokens: normalized, split on the normalized added tokens, then
 * pre-tokenized (pass 1), or straight to the pre-tokenizer (pass 2). */
static int tok_encode_added(const pln_tokenizer *t, tok_work *w, const uint8_t *s, size_t n, int pass, bool first);

static int tok_encode_text(const pln_tokenizer *t, tok_work *w, const uint8_t *s, size_t n, int pass, bool first) {
    if (n == 0) return 0;
    if (pass == 0) {
        if (t->n_norm == 0) return tok_encode_added(t, w, s, n, 1, first);
        const uint8_t *ns;
        size_t nn;
        bool kept;
        if (tok_normalize(t, w, s, n, &ns, &nn, &kept)) return -1;
        /* the normalized text outlives the next normalize call only if copied */
        uint8_t *copy = pln_xmalloc(nn ? nn : 1);
        memcpy(copy, ns, nn);
        int rc = tok_encode_added(t, w, copy, nn, 1, first && kept);
        free(copy);
        return rc;
    }
    return tok_pre_run(t, w, 0, s, n, first);
}

/* HF's AddedVocabulary::find_matches for one pass (0: tokens matched on the raw text, 1: the
 * normalized ones on normalized text): leftmost-longest, single_word, lstrip, rstrip. */
static int tok_encode_added(const pln_tokenizer *t, tok_work *w, const uint8_t *s, size_t n, int pass, bool first) {
    int trie = pass == 0 ? 0 : 1;
    if (!t->any_added[trie] || n == 0) return tok_encode_text(t, w, s, n, pass, first);
    size_t start_offset = 0;
    for (size_t i = 0; i < n; i++) {
        if (!t->added_first_byte[trie][s[i]]) continue;
        int best = -1;
        for (int k = 0; k < t->n_added; k++) {
            const tok_added *a = &t->added[k];
            if (a->normalized != (trie == 1) || a->match_len > n - i || memcmp(a->match, s + i, a->match_len) != 0) continue;
            if (best < 0 || a->match_len > t->added[best].match_len) best = k;
        }
        if (best < 0) continue;
        const tok_added *a = &t->added[best];
        size_t start = i, stop = i + a->match_len;
        size_t next_i = stop;           /* the matcher resumes after the match itself */
        if (a->single_word) {
            bool start_space = start == 0 || !tok_word_at(t, s, start, true);
            bool stop_space = stop == n || !tok_word_at(t, s + stop, n - stop, false);
            if (!start_space || !stop_space) {
                i = next_i - 1;          /* the automaton moves on after the discarded match */
                continue;
            }
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t p = ns - 1;
                while (p > 0 && (s[p] & 0xC0) == 0x80) p--;
                if (!tok_is_ws(tok_utf8_cp(s + p, ns - p))) break;
                ns = p;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip)
            while (stop < n) {
                size_t l = tok_utf8_len(s + stop, n - stop);
                if (!tok_is_ws(tok_utf8_cp(s + stop, l))) break;
                stop += l;
            }
        if (start_offset < start && tok_encode_text(t, w, s + start_offset, start - start_offset, pass, first && start_offset == 0))
            return -1;
        tok_out(w, a->id);
        start_offset = stop;
        i = next_i - 1;                  /* as HF: the automaton resumes after the match, not the strip */
    }
    if (start_offset < n && tok_encode_text(t, w, s + start_offset, n - start_offset, pass, first && start_offset == 0))
        return -1;
    return 0;
}

static int tok_encode(const pln_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids_out,
                      size_t *n_out) {
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
    if (add_special)
        for (size_t i = 0; i < t->n_post_pre; i++) tok_out(&w, t->post_pre[i]);
    int rc = tok_encode_added(t, &w, s, len, 0, true);
    if (add_special)
        for (size_t i = 0; i < t->n_post_post; i++) tok_out(&w, t->post_post[i]);
    free(w.sym_id); free(w.sym_prev); free(w.sym_next); free(w.sym_len); free(w.heap);
    for (int k = 0; k <= TOK_MAX_PRE; k++) {
        free(w.scratch[k].p); free(w.spans[k]);
        if (w.mds[k]) pcre2_match_data_free(w.mds[k]);
    }
    free(w.norm_a.p); free(w.norm_b.p); free(w.key.p);
    tok_last_work = w.work;
    if (rc) { free(w.ids); return -1; }
    if (w.n == 0) { free(w.ids); return 0; }
    *ids_out = w.ids;
    *n_out = w.n;
    return 0;
}

int pln_tok_encode(const pln_tokenizer *t, const char *text, size_t len, int32_t **ids_out, size_t *n_out) {
    return tok_encode(t, text, len, false, ids_out, n_out);
}

int pln_tok_encode_special(const pln_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids_out,
                           size_t *n_out) {
    return tok_encode(t, text, len, add_special, ids_out, n_out);
}

/* ---- decode ------------------------------------------------------------------------------
 * Each token goes through the decoder chain by itself (per-token stages: Replace, ByteFallback's
 * byte tokens, Metaspace, Strip before Fuse, ByteLevel's map); what acts on the whole text is
 * state: a Strip after Fuse (leading characters), the UTF-8 assembly (ByteLevel: one U+FFFD per
 * invalid sequence, as from_utf8_lossy; ByteFallback: one per byte, as HF), and the " " that
 * joins tokens when there is no decoder. */

/* The chain on one token string into out. first: the text's first token (Metaspace drops its
 * replacement there). *is_byte: ByteFallback turned it into a raw byte. */
static void tok_dec_token(const pln_tokenizer *t, const char *str, size_t n, bool first, tok_buf *out, bool *is_byte,
                          const int16_t *byte_of_cp) {
    tok_buf a = {0}, b = {0};
    tok_buf_put(&a, str, n);
    *is_byte = false;
    for (int k = 0; k < t->n_dec; k++) {
        const tok_dec *d = &t->dec[k];
        b.n = 0;
        switch (d->kind) {
        case TD_REPLACE: {
            pcre2_match_data *md = pcre2_match_data_create_from_pattern(d->re, NULL);
            if (tok_replace(t, d->re, md, a.p, a.n, d->str, d->str_len, &b)) { b.n = 0; tok_buf_put(&b, a.p, a.n); }
            pcre2_match_data_free(md);
            break;
        }
        case TD_BYTE_FALLBACK: {
            /* "<0xHH>", parsed as Rust's u8::from_str_radix(&token[3..5], 16) */
            const char *p = (const char *)a.p;
            int v = -1;
            if (a.n == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>') {
                int d0 = -2, d1;
                char c0 = p[3], c1 = p[4];
#define HEXV(c) ((c) >= '0' && (c) <= '9' ? (c) - '0' : ((c) | 32) >= 'a' && ((c) | 32) <= 'f' ? ((c) | 32) - 'a' + 10 : -1)
                d1 = HEXV(c1);
                if (c0 == '+') d0 = 0;
                else d0 = HEXV(c0);
#undef HEXV
                if (d0 >= 0 && d1 >= 0) v = d0 * 16 + d1;
            }
            if (v >= 0) { uint8_t c = (uint8_t)v; tok_buf_put(&b, &c, 1); *is_byte = true; }
            else tok_buf_put(&b, a.p, a.n);
            break;
        }
        case TD_FUSE:
            tok_buf_put(&b, a.p, a.n);
            break;
        case TD_STRIP: {
            size_t s0 = 0, e = a.n, cl = (size_t)d->ch_len;
            if (!d->fused) {
                for (int i = 0; i < d->start && e - s0 >= cl && memcmp(a.p + s0, d->ch, cl) == 0; i++) s0 += cl;
                for (int i = 0; i < d->stop && e - s0 >= cl && memcmp(a.p + e - cl, d->ch, cl) == 0; i++) e -= cl;
            }
            tok_buf_put(&b, a.p + s0, e - s0);
            break;
        }
        case TD_METASPACE: {
            size_t cl = (size_t)d->ch_len;
            bool drop = d->prepend && (first || d->fused);
            for (size_t i = 0; i < a.n;) {
                if (a.n - i >= cl && memcmp(a.p + i, d->ch, cl) == 0) {
                    if (!drop) tok_buf_put(&b, " ", 1);
                    i += cl;
                } else {
                    tok_buf_put(&b, a.p + i, 1);
                    i++;
                }
            }
            break;
        }
        case TD_BYTE_LEVEL: {
            uint8_t *tmp = pln_xmalloc(a.n + 1);
            uint32_t l = tok_string_bytes((const char *)a.p, a.n, byte_of_cp, tmp);
            tok_buf_put(&b, tmp, l);
            free(tmp);
            break;
        }
        }
        tok_buf tmp = a; a = b; b = tmp;
    }
    out->n = 0;
    tok_buf_put(out, a.p ? a.p : (uint8_t *)"", a.n);
    free(a.p); free(b.p);
}

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

/* U+FFFD for an invalid pending sequence: one, or one per byte under ByteFallback. */
static size_t tok_put_fffd(char *out, size_t cap, int count) {
    size_t o = 0;
    for (int i = 0; i < count && o + 3 <= cap; i++) { memcpy(out + o, tok_fffd, 3); o += 3; }
    return o;
}

/* Feeds one byte; appends complete output to out (bounded by cap). Returns bytes written. */
static size_t tok_stream_byte(const pln_tokenizer *t, pln_tok_stream *s, uint8_t c, char *out, size_t cap) {
    size_t o = 0;
    for (;;) {
        if (s->n_pend == 0) {
            uint8_t lo, hi;
            int need = tok_lead(c, &lo, &hi);
            if (need == 1) { if (o < cap) out[o++] = (char)c; return o; }
            if (need == 0) return o + tok_put_fffd(out + o, cap - o, 1);
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
        /* the pending prefix is a maximal invalid subsequence, then c starts afresh */
        o += tok_put_fffd(out + o, cap - o, t->dec_byte_fallback && !t->dec_byte_level ? s->n_pend : 1);
        s->n_pend = 0;
    }
}

/* Bytes of one decoded token through the whole-text state (leading Strip, UTF-8 assembly). */
static inline size_t tok_stream_bytes(const pln_tokenizer *t, pln_tok_stream *s, const uint8_t *b, size_t n, char *out,
                                      size_t cap) {
    size_t o = 0, i = 0, cl = (size_t)t->strip_ch_len;
    while (i < n && t->strip_n > 0 && !s->strip_done) {
        if (n - i >= cl && memcmp(b + i, t->strip_ch, cl) == 0) {
            i += cl;
            if (++s->n_stripped >= t->strip_n) s->strip_done = true;
        } else {
            s->strip_done = true;
        }
    }
    while (i < n) {
        uint8_t c = b[i];
        if (s->n_pend == 0) {
            /* whole valid characters go straight through */
            if (c < 0x80 && o < cap) { out[o++] = (char)c; i++; continue; }
            size_t l = c < 0x80 ? 1 : tok_utf8_len(b + i, n - i);
            if (l && o + l <= cap) {
                for (size_t z = 0; z < l; z++) out[o + z] = (char)b[i + z];   /* 1–4 bytes: no memcpy call */
                o += l;
                i += l;
                continue;
            }
        }
        o += tok_stream_byte(t, s, c, out + o, cap - o);
        i++;
    }
    return o;
}

static bool tok_id_ok(const pln_tokenizer *t, int32_t id, bool skip_special) {
    return id >= 0 && id < t->n_ids && t->tok_bytes_off[id] != UINT64_MAX && !(skip_special && t->is_special[id]);
}

/* A ByteFallback byte token into the stream. HF judges a run of byte tokens as a whole: once
 * the run cannot be UTF-8 any more, each of its bytes (pending ones included) is one U+FFFD. */
static size_t tok_stream_run_byte(const pln_tokenizer *t, pln_tok_stream *s, uint8_t c, char *out, size_t cap) {
    if (s->run_bad) return tok_put_fffd(out, cap, 1);
    if (t->strip_n > 0 && !s->strip_done) {
        if (t->strip_ch_len == 1 && c == t->strip_ch[0]) {
            if (++s->n_stripped >= t->strip_n) s->strip_done = true;
            return 0;
        }
        s->strip_done = true;
    }
    uint8_t lo, hi;
    if (s->n_pend == 0) {
        int need = tok_lead(c, &lo, &hi);
        if (need == 0) { s->run_bad = true; return tok_put_fffd(out, cap, 1); }
        return tok_stream_byte(t, s, c, out, cap);
    }
    tok_lead(s->pend[0], &lo, &hi);
    if (s->n_pend > 1) { lo = 0x80; hi = 0xBF; }
    if (c >= lo && c <= hi) return tok_stream_byte(t, s, c, out, cap);
    int n = s->n_pend + 1;
    s->n_pend = 0;
    s->run_bad = true;
    return tok_put_fffd(out, cap, n);
}

/* One token (already filtered) into the stream: the joining " ", its first or usual form. */
static size_t tok_stream_token(const pln_tokenizer *t, pln_tok_stream *s, int32_t id, char *out, size_t cap) {
    size_t o = 0;
    if (t->is_byte && t->is_byte[id]) {
        s->n_tokens++;
        return tok_stream_run_byte(t, s, t->bytes_arena[t->tok_bytes_off[id]], out, cap);
    }
    s->run_bad = false;
    if (t->no_decoder && s->n_tokens > 0) o += tok_stream_bytes(t, s, (const uint8_t *)" ", 1, out, cap);
    bool first = s->n_tokens == 0;
    s->n_tokens++;
    if (first && t->dec_first_differs) {
        int16_t byte_of_cp[324];
        uint32_t cp_of_byte[256];
        tok_byte_map(cp_of_byte);
        for (int c = 0; c < 324; c++) byte_of_cp[c] = -1;
        for (int b = 0; b < 256; b++) byte_of_cp[cp_of_byte[b]] = (int16_t)b;
        tok_buf fb = {0};
        bool is_byte;
        tok_dec_token(t, t->tok_str[id], t->tok_str_len[id], true, &fb, &is_byte, byte_of_cp);
        o += tok_stream_bytes(t, s, fb.p, fb.n, out + o, cap - o);
        free(fb.p);
        return o;
    }
    return o + tok_stream_bytes(t, s, t->bytes_arena + t->tok_bytes_off[id], t->tok_bytes_len[id], out + o, cap - o);
}

size_t pln_tok_stream_push(const pln_tokenizer *t, pln_tok_stream *s, int32_t id, bool skip_special,
                           char *out, size_t cap) {
    if (!tok_id_ok(t, id, skip_special)) return 0;
    return tok_stream_token(t, s, id, out, cap);
}

size_t pln_tok_stream_flush(const pln_tokenizer *t, pln_tok_stream *s, char *out, size_t cap) {
    size_t o = 0;
    if (s->n_pend > 0) o = tok_put_fffd(out, cap, t->dec_byte_fallback && !t->dec_byte_level ? s->n_pend : 1);
    memset(s, 0, sizeof *s);
    return o;
}

char *pln_tok_decode(const pln_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, size_t *len_out) {
    size_t total = 16;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n_ids) total += 3 * (size_t)t->tok_bytes_len[ids[i]] + 1;
    char *out = pln_xmalloc(total);
    pln_tok_stream st = {0};
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (!tok_id_ok(t, ids[i], skip_special)) continue;
        if (!t->is_byte || !t->is_byte[ids[i]]) { o += tok_stream_token(t, &st, ids[i], out + o, total - o); continue; }
        /* ByteFallback: a run of byte tokens is one string if it is valid UTF-8 as a whole,
         * else one U+FFFD per byte (HF's ByteFallback decoder) */
        uint8_t run[256];
        size_t nr = 0, j = i, count = 0;
        bool too_long = false;
        for (; j < n; j++) {
            if (!tok_id_ok(t, ids[j], skip_special)) continue;
            if (!t->is_byte[ids[j]]) break;
            if (nr < sizeof run) run[nr++] = t->bytes_arena[t->tok_bytes_off[ids[j]]];
            else too_long = true;
            count++;
        }
        bool valid = true;
        if (too_long) {
            /* validate the whole run straight from the ids */
            uint8_t *all = pln_xmalloc(count);
            size_t k = 0;
            for (size_t q = i; q < j; q++)
                if (tok_id_ok(t, ids[q], skip_special)) all[k++] = t->bytes_arena[t->tok_bytes_off[ids[q]]];
            for (size_t q = 0; q < count && valid;) { size_t l = tok_utf8_len(all + q, count - q); if (!l) valid = false; q += l; }
            if (valid) o += tok_stream_bytes(t, &st, all, count, out + o, total - o);
            free(all);
        } else {
            for (size_t q = 0; q < nr && valid;) { size_t l = tok_utf8_len(run + q, nr - q); if (!l) valid = false; q += l; }
            if (valid) o += tok_stream_bytes(t, &st, run, nr, out + o, total - o);
        }
        if (!valid) {
            for (size_t q = 0; q < count; q++) o += tok_stream_bytes(t, &st, (const uint8_t *)tok_fffd, 3, out + o, total - o);
        }
        st.n_tokens++;
        i = j - 1;
    }
    o += pln_tok_stream_flush(t, &st, out + o, total - o);
    out[o] = 0;
    if (len_out) *len_out = o;
    return out;
}
static int tok_normalize_str(const pln_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n);

static int tok_load_model(pln_tokenizer *t, json_t *root, tok_lists *l, const int16_t *byte_of_cp) {
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return pln_errorf("%s: model missing or not an object", t->path);
    const char *ty = tok_json_type(model);
    if (ty && strcmp(ty, "BPE") != 0) return pln_errorf("%s: model.type \"%s\" is not supported (expected BPE)", t->path, ty);
    json_t *v;
    if ((v = json_object_get(model, "dropout")) && !json_is_null(v))
        return pln_errorf("%s: model.dropout must be null (BPE dropout is random at encode time)", t->path);
    if ((v = json_object_get(model, "continuing_subword_prefix")) && json_is_string(v) && json_string_length(v) > 0) {
        t->cont_prefix = pln_xstrdup(json_string_value(v));
        t->cont_prefix_len = json_string_length(v);
    }
    if ((v = json_object_get(model, "end_of_word_suffix")) && json_is_string(v) && json_string_length(v) > 0) {
        t->word_suffix = pln_xstrdup(json_string_value(v));
        t->word_suffix_len = json_string_length(v);
    }
    t->byte_fallback = !tok_json_false(model, "byte_fallback");
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
        int64_t id = json_integer_value(json_object_get(val, "id"));
        bool special = !tok_json_false(val, "special"), normalized = tok_json_bool(val, "normalized", !special);
        char *match = NULL;
        size_t match_len = cl;
        /* a normalized token is matched, and decoded, as the normalizer writes it */
        if (normalized && t->n_norm > 0) {
            if (tok_normalize_str(t, cs, cl, &match, &match_len)) { rc = -1; break; }
        } else {
            match = pln_xstrdup(cs);
        }
        if (str_off[id] == SIZE_MAX) {
            str_off[id] = tok_arena_put(&l->arena, match, match_len);
            t->tok_str_len[id] = (uint32_t)match_len;
        } else if (t->tok_str_len[id] != cl || memcmp(l->arena.p + str_off[id], cs, cl) != 0) {
            rc = pln_errorf("%s: added_tokens[%zu]: id %lld is both \"%s\" and \"%s\"", t->path, i, (long long)id,
                            (char *)l->arena.p + str_off[id], cs);
            free(match);
            break;
        }
        tok_added *a = &t->added[t->n_added++];
        a->content = pln_xstrdup(cs);
        a->len = cl;
        a->id = (int32_t)id;
        a->special = special;
        a->normalized = normalized;
        a->lstrip = !tok_json_false(val, "lstrip");
        a->rstrip = !tok_json_false(val, "rstrip");
        a->single_word = !tok_json_false(val, "single_word");
        t->is_special[id] = a->special;
        a->match = match;
        a->match_len = match_len;
        if (a->match_len == 0) { a->normalized = true; continue; }   /* normalizes to nothing: never matched */
        t->added_first_byte[a->normalized][(uint8_t)a->match[0]] = true;
        t->any_added[a->normalized] = true;
    }
    if (rc) { free(str_off); return -1; }

    /* the arena is final: pointers, raw bytes (into a second arena), vocab hash */
    t->str_arena = (char *)l->arena.p;
    l->arena.p = NULL;
    t->tok_str = pln_xcalloc((size_t)t->n_ids, sizeof *t->tok_str);
    t->tok_bytes_off = pln_xmalloc((size_t)t->n_ids * sizeof *t->tok_bytes_off);
    t->tok_bytes_len = pln_xcalloc((size_t)t->n_ids, sizeof *t->tok_bytes_len);
    if (t->dec_byte_fallback) t->is_byte = pln_xcalloc((size_t)t->n_ids, sizeof *t->is_byte);
    /* each token's decoded bytes (as a token after the first): ByteLevel alone is the common
     * case and maps straight; any other chain runs per token */
    bool plain_byte_level = t->n_dec == 1 && t->dec[0].kind == TD_BYTE_LEVEL;
    tok_buf bytes = {0}, one = {0};
    for (int64_t id = 0; id < t->n_ids; id++) {
        t->tok_bytes_off[id] = UINT64_MAX;
        if (str_off[id] == SIZE_MAX) continue;
        t->tok_str[id] = t->str_arena + str_off[id];
        size_t bo = bytes.n;
        uint32_t bl;
        if (plain_byte_level) {
            if (bytes.n + t->tok_str_len[id] + 1 > bytes.cap) tok_buf_put(&bytes, t->tok_str[id], t->tok_str_len[id] + 1);
            bl = tok_string_bytes(t->tok_str[id], t->tok_str_len[id], byte_of_cp, bytes.p + bo);
            bytes.n = bo + bl;
        } else if (t->no_decoder || t->n_dec == 0) {
            bl = t->tok_str_len[id];
            tok_buf_put(&bytes, t->tok_str[id], bl);
        } else {
            bool is_byte;
            tok_dec_token(t, t->tok_str[id], t->tok_str_len[id], false, &one, &is_byte, byte_of_cp);
            if (t->is_byte) t->is_byte[id] = is_byte;
            bl = (uint32_t)one.n;
            tok_buf_put(&bytes, one.p ? one.p : (uint8_t *)"", one.n);
        }
        tok_buf_put(&bytes, "", 1);
        t->tok_bytes_off[id] = bo;
        t->tok_bytes_len[id] = bl;
        if (bl > t->max_token_bytes) t->max_token_bytes = bl;
    }
    if (t->no_decoder) t->max_token_bytes++;     /* the joining space */
    free(one.p);
    t->bytes_arena = bytes.p ? bytes.p : pln_xmalloc(1);
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
    for (int b = 0; b < 256; b++) {
        char code[8];
        snprintf(code, sizeof code, "<0x%02X>", b);
        t->fallback_id[b] = tok_vocab_find(t, code, 6);
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
        /* with a continuing_subword_prefix the right part loses it in the merged token (HF's
         * BpeBuilder: a + b[prefix_len..]) */
        size_t cut = t->cont_prefix_len;
        if (cut > lb || (cut < lb && ((uint8_t)b[cut] & 0xC0) == 0x80)) {
            pln_errorf("%s: model.merges[%zu] (\"%s\" + \"%s\"): the right token is shorter than "
                       "continuing_subword_prefix \"%s\"", t->path, k, a, b, t->cont_prefix);
            free(cat);
            return -1;
        }
        memcpy(cat, a, la); memcpy(cat + la, b + cut, lb - cut); cat[la + lb - cut] = 0;
        int32_t ia = tok_vocab_find(t, a, la), ib = tok_vocab_find(t, b, lb), in = tok_vocab_find(t, cat, la + lb - cut);
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

static int tok_normalize_str(const pln_tokenizer *t, const char *s, size_t n, char **out, size_t *out_n) {
    tok_work w = {0};
    const uint8_t *r;
    size_t rn;
    int rc = tok_normalize(t, &w, (const uint8_t *)s, n, &r, &rn, NULL);
    if (!rc) {
        *out = pln_xmalloc(rn + 1);
        memcpy(*out, r, rn);
        (*out)[rn] = 0;
        *out_n = rn;
    }
    free(w.norm_a.p); free(w.norm_b.p);
    return rc;
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
    json_t *v;
    if (!rc && (v = json_object_get(root, "truncation")) && !json_is_null(v))
        rc = pln_errorf("%s: truncation is set; pollen does not truncate (HF would cut every encoding): set it to null",
                        path);
    if (!rc && (v = json_object_get(root, "padding")) && !json_is_null(v))
        rc = pln_errorf("%s: padding is set; pollen does not pad encodings: set it to null", path);
    if (!rc) rc = tok_load_pipeline(t, root);
    if (!rc) rc = tok_load_model(t, root, &lists, byte_of_cp);
    /* the post-processor's ids must be tokens: they go to the model as they are */
    for (size_t i = 0; !rc && i < t->n_post_pre + t->n_post_post; i++) {
        int32_t id = i < t->n_post_pre ? t->post_pre[i] : t->post_post[i - t->n_post_pre];
        if (id >= t->n_ids || t->tok_bytes_off[id] == UINT64_MAX)
            rc = pln_errorf("%s: post_processor adds id %d, which is not a token of this vocabulary (%lld ids)", path,
                            id, (long long)t->n_ids);
    }
    /* ByteLevel's byte→char map as the last stage: BPE starts from the raw bytes instead
     * (byte_id), which is what makes byte-level families fast */
    if (!rc && t->n_pre > 0 && t->pre[t->n_pre - 1].kind == TP_BYTES_TO_CHARS && !t->byte_fallback && !t->cont_prefix &&
        !t->word_suffix) {
        t->n_pre--;
        t->bytes_model = true;
    }
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
    for (int i = 0; i < t->n_added; i++) { free(t->added[i].content); free(t->added[i].match); }
    free(t->added);
    free(t->is_byte);
    free(t->cont_prefix); free(t->word_suffix);
    for (int i = 0; i < t->n_norm; i++) { free(t->norm[i].str); if (t->norm[i].re) pcre2_code_free(t->norm[i].re); }
    for (int i = 0; i < TOK_MAX_PRE; i++) if (t->pre[i].re) pcre2_code_free(t->pre[i].re);
    for (int i = 0; i < t->n_dec; i++) { free(t->dec[i].str); if (t->dec[i].re) pcre2_code_free(t->dec[i].re); }
    free(t->post_pre); free(t->post_post);
    if (t->word_re) pcre2_code_free(t->word_re);
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

const char *pln_tok_token_str(const pln_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !t->tok_str[id]) { if (len) *len = 0; return NULL; }
    if (len) *len = t->tok_str_len[id];
    return t->tok_str[id];
}
