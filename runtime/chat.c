/* chat.c — loading a model's chat template and rendering a conversation with it (see chat.h). */
#include "runtime/chat.h"
#include "formats/common.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* tokenizer_config.json holds the whole added-token table: Llama 3's is 50 KB, some are MBs. */
#define CHAT_FILE_MAX ((size_t)64 << 20)

struct pln_chat {
    pln_jinja *def;        /* the default template */
    pln_jinja *tool_use;   /* the "tool_use" template, or NULL */
    json_t *tokens;        /* {"bos_token": "<s>", ...}: the special tokens as strings */
    char *source;
};

static bool is_dir(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISDIR(st.st_mode); }
static bool exists(const char *p) { struct stat st; return lstat(p, &st) == 0; }
static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static json_t *load_json(const char *path) {
    size_t n = 0;
    char *text = pln_read_small_file(path, CHAT_FILE_MAX, &n);
    if (!text) return NULL;
    json_error_t je;
    json_t *o = json_loadb(text, n, 0, &je);
    free(text);
    if (!o) { pln_errorf("%s: not valid JSON: %s (line %d)", path, je.text, je.line); return NULL; }
    if (!json_is_object(o)) { json_decref(o); pln_errorf("%s: expected a JSON object", path); return NULL; }
    return o;
}

/* A special token is a string or an AddedToken object {"content": str, ...}. */
static const char *token_text(json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content"))) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static int load_tokens(pln_chat *c, const char *path) {
    json_t *o = load_json(path);
    if (!o) return -1;
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", NULL};
    for (int i = 0; keys[i]; i++) {
        json_t *v = json_object_get(o, keys[i]);
        if (!v || json_is_null(v)) continue;   /* transformers leaves unset tokens out: undefined in the template */
        const char *s = token_text(v);
        if (!s) { json_decref(o); return pln_errorf("%s: \"%s\" must be a string or {\"content\": string}", path, keys[i]); }
        json_object_set_new(c->tokens, keys[i], json_string(s));
    }
    json_t *add = json_object_get(o, "additional_special_tokens");
    if (json_is_array(add)) {
        json_t *l = json_array(), *e;
        size_t i;
        json_array_foreach(add, i, e) { const char *s = token_text(e); if (s) json_array_append_new(l, json_string(s)); }
        json_object_set_new(c->tokens, "additional_special_tokens", l);
    }
    json_decref(o);
    return 0;
}

/* The template's name in its errors is the file's own name, not its path: render errors reach
 * HTTP clients, which have no business learning where the server keeps its models. */
static pln_jinja *parse_text(const char *text, size_t n, const char *name) {
    const char *slash = strrchr(name, '/');
    pln_jinja *t = pln_jinja_parse(text, n, slash ? slash + 1 : name);
    if (!t) pln_error_context("%s: pollen cannot render this chat template", name);
    return t;
}

/* tokenizer_config.json's "chat_template": a string, or [{name, template}, ...]. */
static int load_from_config(pln_chat *c, const char *path, bool *absent) {
    json_t *o = load_json(path);
    if (!o) return -1;
    json_t *ct = json_object_get(o, "chat_template");
    int rc = 0;
    char *name = pln_xasprintf("%s (chat_template)", path);
    if (!ct || json_is_null(ct)) {
        if (absent) *absent = true;
        rc = pln_errorf("%s has no \"chat_template\"", path);
    } else if (json_is_string(ct)) {
        if (!(c->def = parse_text(json_string_value(ct), json_string_length(ct), name))) rc = -1;
    } else if (json_is_array(ct)) {
        json_t *e;
        size_t i;
        json_array_foreach(ct, i, e) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            json_t *tx = json_object_get(e, "template");
            if (!nm || !json_is_string(tx)) { rc = pln_errorf("%s: chat_template[%zu] must be {\"name\": string, \"template\": string}", path, i); break; }
            if (strcmp(nm, "default") && strcmp(nm, "tool_use")) continue;
            char *tn = pln_xasprintf("%s (chat_template \"%s\")", path, nm);
            pln_jinja *t = parse_text(json_string_value(tx), json_string_length(tx), tn);
            free(tn);
            if (!t) { rc = -1; break; }
            pln_jinja **slot = strcmp(nm, "default") ? &c->tool_use : &c->def;
            pln_jinja_free(*slot);
            *slot = t;
        }
        if (!rc && !c->def)
            rc = pln_errorf("%s: chat_template lists templates but none named \"default\"; give one with --chat-template FILE", path);
    } else {
        rc = pln_errorf("%s: \"chat_template\" must be a string or a list of {\"name\", \"template\"}", path);
    }
    if (!rc) c->source = name; else free(name);
    json_decref(o);
    return rc;
}

static int load_jinja_file(pln_chat *c, const char *path) {
    size_t n = 0;
    char *text = pln_read_small_file(path, CHAT_FILE_MAX, &n);
    if (!text) return -1;
    c->def = parse_text(text, n, path);
    free(text);
    if (!c->def) return -1;
    c->source = pln_xstrdup(path);
    return 0;
}

pln_chat *pln_chat_load(const char *path, const char *tokens_config, bool *absent) {
    if (absent) *absent = false;
    pln_chat *c = pln_xcalloc(1, sizeof *c);
    c->tokens = json_object();
    int rc = 0;
    char *tok_auto = NULL;
    if (is_dir(path)) {
        char *jf = pln_xasprintf("%s/chat_template.jinja", path);
        char *cf = pln_xasprintf("%s/tokenizer_config.json", path);
        if (exists(jf)) rc = load_jinja_file(c, jf);
        else if (exists(cf)) rc = load_from_config(c, cf, absent);
        else {
            if (absent) *absent = true;
            rc = pln_errorf("%s has no chat template (neither chat_template.jinja nor tokenizer_config.json)", path);
        }
        if (exists(cf)) tok_auto = pln_xstrdup(cf);
        free(jf);
        free(cf);
    } else if (ends_with(path, ".json")) {
        rc = load_from_config(c, path, absent);
        tok_auto = pln_xstrdup(path);
    } else {
        rc = load_jinja_file(c, path);
        const char *slash = strrchr(path, '/');
        char *cf = slash ? pln_xasprintf("%.*s/tokenizer_config.json", (int)(slash - path), path) : pln_xstrdup("tokenizer_config.json");
        if (exists(cf)) tok_auto = cf; else free(cf);
    }
    const char *tp = tokens_config ? tokens_config : tok_auto;
    if (!rc && tp && load_tokens(c, tp)) rc = -1;
    free(tok_auto);
    if (rc) { pln_chat_free(c); return NULL; }
    return c;
}

void pln_chat_free(pln_chat *c) {
    if (!c) return;
    pln_jinja_free(c->def);
    pln_jinja_free(c->tool_use);
    json_decref(c->tokens);
    free(c->source);
    free(c);
}

const char *pln_chat_source(const pln_chat *c) { return c->source; }

static const char *const g_reserved[] = {"messages", "tools", "documents", "add_generation_prompt", NULL};

int pln_chat_check_extra(json_t *extra) {
    if (!extra || json_is_null(extra)) return 0;
    if (!json_is_object(extra)) return pln_errorf("chat template variables must be a JSON object");
    for (int i = 0; g_reserved[i]; i++)
        if (json_object_get(extra, g_reserved[i]))
            return pln_errorf("chat template variables may not set `%s` (the conversation sets it)", g_reserved[i]);
    return 0;
}

pln_jinja_status pln_chat_render(const pln_chat *c, json_t *messages, json_t *tools, bool add_generation_prompt,
                                 json_t *extra, const pln_jinja_limits *lim, char **out, size_t *out_len) {
    json_t *vars = json_object();
    json_object_update(vars, c->tokens);
    if (json_is_object(extra)) json_object_update(vars, extra);   /* checked by pln_chat_check_extra */
    json_object_set(vars, "messages", messages);
    json_object_set_new(vars, "tools", tools ? json_incref(tools) : json_null());
    json_object_set_new(vars, "documents", json_null());
    json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    const pln_jinja *t = tools && c->tool_use ? c->tool_use : c->def;
    pln_jinja_status st = pln_jinja_render(t, vars, lim, out, out_len);
    json_decref(vars);
    return st;
}
