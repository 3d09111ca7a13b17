/* cmd_template.c — `pollen template PATH --messages FILE.json`: renders a conversation with a
 * model's own chat template and prints the prompt exactly (no newline added), to debug what the
 * model is given, as `/v1/chat/completions` builds it. */
#include "formats/common.h"
#include "formats/shard.h"
#include "runtime/chat.h"
#include "tools/cmd.h"
#include "tools/opt.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static json_t *read_json(const char *opt, const char *path) {
    size_t n = 0;
    char *text = pln_read_small_file(path, (size_t)64 << 20, &n);
    if (!text) pln_die("%s %s", opt, pln_error());
    json_error_t je;
    json_t *v = json_loadb(text, n, 0, &je);
    free(text);
    if (!v) pln_die("%s %s: not valid JSON: %s (line %d)", opt, path, je.text, je.line);
    return v;
}

int cmd_template(int argc, char **argv) {
    const char *msg_path = NULL, *tools_path = NULL, *tokens = NULL, *kwargs_text = NULL, *path = NULL;
    bool no_gen = false;
    pln_opt opts[] = {
        PLN_O_POS("SET|CHECKPOINT|TEMPLATE.jinja|TOKENIZER_CONFIG.json", path, "the template", .flags = PLN_OPT_REQUIRED),
        PLN_O_STR("messages", 0, msg_path, "FILE",
                  "a JSON array of messages ([{\"role\": \"user\", \"content\": \"Hi\"}]), or an object "
                  "{\"messages\": [...], \"tools\": [...]}", .flags = PLN_OPT_REQUIRED),
        PLN_O_STR("tools", 0, tools_path, "FILE", "a JSON array of tools (OpenAI's function format) the template sees"),
        PLN_O_FLAG("no-generation-prompt", 0, no_gen,
                   "add_generation_prompt=false (default true: the prompt ends where the assistant's answer begins)"),
        PLN_O_STR("tokens", 0, tokens, "FILE", "take bos_token, eos_token, ... from this tokenizer_config.json"),
        PLN_O_STR("kwargs", 0, kwargs_text, "JSON",
                  "more template variables, as apply_chat_template(**kwargs) and vLLM's chat_template_kwargs: "
                  "'{\"enable_thinking\": false}'"),
        PLN_O_END,
    };
    pln_opt_cmd cmd = {
        .cmd = "template",
        .synopsis = "pollen template SET|CHECKPOINT|TEMPLATE.jinja|TOKENIZER_CONFIG.json --messages FILE.json [--tools FILE.json] "
                    "[--no-generation-prompt] [--kwargs JSON]",
        .intro = "\nPrints the prompt the chat template makes of a conversation, byte for byte as transformers'\n"
                 "apply_chat_template (no newline is added).\n"
                 "The template: a shard set's, a Hugging Face model directory's, a .jinja file or a tokenizer_config.json.\n",
        .epilog = "The messages file may also be {\"messages\": [...], \"tools\": [...], \"chat_template_kwargs\": {...}}.\n",
        .opts = opts, .rank = 0};
    pln_opt_parse_or_exit(&cmd, argc, argv);
    pln_opt_free(&cmd);
    bool gen = !no_gen;

    json_t *doc = read_json("--messages", msg_path), *messages = doc, *tools = NULL, *kwargs = NULL;
    if (json_is_object(doc)) {
        messages = json_object_get(doc, "messages");
        tools = json_object_get(doc, "tools");
        if (tools && json_is_null(tools)) tools = NULL;
        kwargs = json_object_get(doc, "chat_template_kwargs");
    }
    json_t *kwargs_doc = NULL;
    if (kwargs_text) {
        json_error_t je;
        kwargs_doc = json_loads(kwargs_text, 0, &je);
        if (!kwargs_doc) pln_die("--kwargs: not valid JSON: %s", je.text);
        kwargs = kwargs_doc;
    }
    if (pln_chat_check_extra(kwargs)) pln_die("%s: %s", kwargs_text ? "--kwargs" : msg_path, pln_error());
    if (!json_is_array(messages))
        pln_die("--messages %s: expected a JSON array of messages, or an object with \"messages\": [...]", msg_path);
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m)
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
            pln_die("--messages %s: message %zu must be an object with a string \"role\"", msg_path, i);
    json_t *tools_doc = NULL;
    if (tools_path) {
        tools_doc = read_json("--tools", tools_path);
        if (!json_is_array(tools_doc)) pln_die("--tools %s: expected a JSON array of tools", tools_path);
        tools = tools_doc;
    }
    if (tools && !json_is_array(tools)) pln_die("--messages %s: \"tools\" must be an array", msg_path);

    /* --tokens is read by pln_chat_load, after PATH: named here with its flag, as --messages is. */
    if (tokens && pln_check_file(tokens)) pln_die("--tokens %s", pln_error());
    /* A shard set's chat files are checksummed in its manifest: check them as serve's load does. */
    char *manifest = pln_xasprintf("%s/manifest.json", path);
    struct stat mst;
    if (stat(manifest, &mst) == 0) {
        pln_shardset *set = pln_shardset_open(path);
        if (!set) pln_die("%s", pln_error());
        pln_shardset_close(set);
    }
    free(manifest);
    pln_chat *chat = pln_chat_load(path, tokens, NULL);
    if (!chat) pln_die("%s", pln_error());
    char *out = NULL;
    size_t n = 0;
    pln_jinja_status st = pln_chat_render(chat, messages, tools, gen, kwargs, NULL, &out, &n);
    int rc = 0;
    if (st == PLN_JINJA_OK) {
        if (fwrite(out, 1, n, stdout) != n || fflush(stdout)) { fprintf(stderr, "pollen template: writing stdout failed\n"); rc = 1; }
    } else if (st == PLN_JINJA_RAISED) {
        fprintf(stderr, "pollen template: %s refuses this conversation: %s\n", pln_chat_source(chat), pln_error());
        rc = 1;
    } else {
        fprintf(stderr, "pollen template: %s\n", pln_error());
        rc = 1;
    }
    free(out);
    pln_chat_free(chat);
    json_decref(tools_doc);
    json_decref(kwargs_doc);
    json_decref(doc);
    return rc;
}
