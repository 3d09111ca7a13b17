/* cmd_tokenize.c — `pollen tokenize PATH`: the model's own tokenizer on a text or an id list, for
 * debugging prompts (as llama.cpp's llama-tokenize): encode stdin (bytes exact) or --text and
 * print the ids, or --decode ids back to the exact text. PATH is a tokenizer.json, a Hugging Face
 * model directory or a pollen shard set. */
#include "formats/common.h"
#include "formats/shard.h"
#include "runtime/tokenizer.h"
#include "tools/cli.h"
#include "tools/cmd.h"
#include "tools/opt.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Text read from stdin at most (a prompt to debug, not a corpus). */
#define TZ_MAX_INPUT ((size_t)256 << 20)

/* Something is at p (a FIFO or a device too: the checked open that reads it names what it is). */
static bool tz_exists(const char *p) {
    struct stat st;
    return lstat(p, &st) == 0;
}

/* The tokenizer.json PATH stands for (malloc'd); dies naming PATH and what to give instead. */
static char *tz_resolve(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0)
        pln_die("%s: %s (give a tokenizer.json, a Hugging Face model directory or a shard set)", path, strerror(errno));
    /* Not a directory: pln_tok_load reads it through the checked open, which names a FIFO, a
     * socket or a device for what it is (and never blocks on one). */
    if (!S_ISDIR(st.st_mode)) return pln_xstrdup(path);
    char *manifest = pln_xasprintf("%s/%s", path, PLN_MANIFEST_NAME);
    bool is_set = tz_exists(manifest);   /* pln_shardset_open names a manifest.json that is not a file */
    free(manifest);
    if (is_set) {
        pln_shardset *set = pln_shardset_open(path);
        if (!set) pln_die("%s", pln_error());
        if (!set->tokenizer_path)
            pln_die("%s: this shard set carries no tokenizer (its manifest says \"tokenizer\": null); give the "
                    "tokenizer.json of the checkpoint it was made from", path);
        char *p = pln_xstrdup(set->tokenizer_path);
        pln_shardset_close(set);
        return p;
    }
    char *tj = pln_xasprintf("%s/tokenizer.json", path);
    if (tz_exists(tj)) return tj;   /* pln_tok_load reads it through the checked open */
    pln_die("%s: no tokenizer.json in this directory (a Hugging Face model directory holds one, a shard set "
            "holds manifest.json); give the tokenizer.json's path", path);
}

static char *tz_read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = pln_xmalloc(cap + 1);
    for (;;) {
        if (n == cap) {
            if (cap >= TZ_MAX_INPUT) pln_die("stdin: more than %zu MiB; tokenize a smaller text", TZ_MAX_INPUT >> 20);
            cap *= 2;
            buf = pln_xrealloc(buf, cap + 1);
        }
        size_t r = fread(buf + n, 1, cap - n, stdin);
        n += r;
        if (r == 0) {
            if (ferror(stdin)) pln_die("stdin: read error: %s", strerror(errno));
            break;
        }
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Ids separated by spaces, commas, newlines (and the brackets of a pasted JSON list). */
static int32_t *tz_parse_ids(const pln_tokenizer *t, const char *s, size_t len, size_t *n_out) {
    size_t n = 0, cap = 64, item = 0;
    int32_t *ids = pln_xmalloc(cap * sizeof *ids);
    int64_t vocab = pln_tok_vocab_size(t);
    for (size_t i = 0; i < len;) {
        char c = s[i];
        if (c == ' ' || c == ',' || c == '\n' || c == '\r' || c == '\t' || c == '[' || c == ']') { i++; continue; }
        size_t j = i;
        while (j < len && !(s[j] == ' ' || s[j] == ',' || s[j] == '\n' || s[j] == '\r' || s[j] == '\t' || s[j] == '[' ||
                            s[j] == ']'))
            j++;
        item++;
        int64_t v = 0;
        bool ok = j - i <= 10;
        for (size_t k = i; ok && k < j; k++) {
            if (s[k] < '0' || s[k] > '9') ok = false;
            else v = v * 10 + (s[k] - '0');
        }
        if (!ok || v >= vocab)
            pln_die("--decode: \"%.*s\" (item %zu) is not a token id of this tokenizer; ids are integers in [0, %lld)",
                    (int)(j - i > 40 ? 40 : j - i), s + i, item, (long long)vocab);
        if (n == cap) { cap *= 2; ids = pln_xrealloc(ids, cap * sizeof *ids); }
        ids[n++] = (int32_t)v;
        i = j;
    }
    *n_out = n;
    return ids;
}

static int tz_run(const char *path, const char *text, bool add_special, bool as_json, bool decode, bool skip_special) {
    char *tj = tz_resolve(path);
    pln_tokenizer *t = pln_tok_load(tj);
    if (!t) pln_die("%s", pln_error());
    free(tj);
    size_t len;
    char *input = text ? pln_xstrdup(text) : tz_read_stdin(&len);
    if (text) len = strlen(text);
    if (decode) {
        size_t n;
        int32_t *ids = tz_parse_ids(t, input, len, &n);
        size_t out_len;
        char *out = pln_tok_decode(t, ids, n, skip_special, &out_len);
        if (as_json) {
            json_t *o = json_pack("{s:s%}", "text", out, out_len);
            char *js = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
            printf("%s\n", js);
            free(js);
            json_decref(o);
        } else {
            fwrite(out, 1, out_len, stdout);
        }
        free(out);
        free(ids);
    } else {
        int32_t *ids;
        size_t n;
        if (pln_tok_encode_special(t, input, len, add_special, &ids, &n))
            pln_die("%s%s", text ? "--text: " : "stdin: ", pln_error());
        if (as_json) {
            json_t *o = json_object(), *ja = json_array(), *jt = json_array();
            for (size_t i = 0; i < n; i++) {
                size_t sl;
                const char *s = pln_tok_token_str(t, ids[i], &sl);
                json_array_append_new(ja, json_integer(ids[i]));
                json_array_append_new(jt, s ? json_stringn(s, sl) : json_null());
            }
            json_object_set_new(o, "ids", ja);
            json_object_set_new(o, "tokens", jt);
            char *js = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
            printf("%s\n", js);
            free(js);
            json_decref(o);
        } else {
            for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
            putchar('\n');
        }
        free(ids);
    }
    free(input);
    pln_tok_free(t);
    if (fflush(stdout) != 0 || ferror(stdout)) pln_die("stdout: write error: %s", strerror(errno));
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *text = NULL, *path = NULL;
    bool add_special = false, as_json = false, decode = false, skip_special = false;
    pln_opt opts[] = {
        PLN_O_POS("SET|CHECKPOINT|TOKENIZER.json", path, "the tokenizer", .flags = PLN_OPT_REQUIRED),
        PLN_O_STR("text", 0, text, "TEXT", "encode TEXT instead of stdin"),
        PLN_O_FLAG("add-special", 0, add_special, "apply the tokenizer's post-processor (BOS/EOS: add_special_tokens=True)"),
        PLN_O_FLAG("json", 0, as_json, "print {\"ids\": [...], \"tokens\": [...]} (tokens as tokenizer.json spells them)"),
        PLN_O_FLAG("decode", 'd', decode,
                   "read ids (space- or comma-separated) from stdin or --text and print the decoded text exactly, "
                   "with no newline added (decode(ids))"),
        PLN_O_FLAG("skip-special", 0, skip_special, "with --decode: leave special tokens out (skip_special_tokens=True)"),
        PLN_O_END,
    };
    pln_opt_cmd cmd = {
        .cmd = "tokenize",
        .synopsis = "pollen tokenize SET|CHECKPOINT|TOKENIZER.json [--text TEXT] [--add-special] [--json]\n"
                    "pollen tokenize SET|CHECKPOINT|TOKENIZER.json --decode [--skip-special] [--text IDS]",
        .intro = "\nSET|CHECKPOINT|TOKENIZER.json: a pollen shard set directory (the tokenizer it carries), a\n"
                 "Hugging Face model directory (its tokenizer.json) or a tokenizer.json.\n"
                 "Encodes the text read from stdin (every byte, trailing newline included) and prints the\n"
                 "ids space-separated on one line, as Hugging Face tokenizers' encode(text).ids.\n",
        .opts = opts, .rank = 0};
    pln_opt_parse_or_exit(&cmd, argc, argv);
    pln_opt_free(&cmd);
    if (decode && add_special) { fprintf(stderr, "pollen tokenize: --add-special is for encoding, not --decode\n"); return 2; }
    if (!decode && skip_special) { fprintf(stderr, "pollen tokenize: --skip-special goes with --decode\n"); return 2; }
    return tz_run(path, text, add_special, as_json, decode, skip_special);
}
