/* chat.h — a model's own chat template: the Jinja template of chat_template.jinja or of
 * tokenizer_config.json's "chat_template" (a string, or a list of {name, template} of which
 * "default" is used, and "tool_use" when the request has tools, as transformers picks), rendered
 * with transformers' apply_chat_template variables: messages, tools, documents,
 * add_generation_prompt and the special tokens of tokenizer_config.json (bos_token, eos_token, ...).
 *
 * Error convention: -1 / NULL after pln_errorf() naming the file and the field. A loaded chat
 * template is immutable: renders from many threads at once are safe. */
#ifndef PLN_CHAT_H
#define PLN_CHAT_H

#include "runtime/jinja.h"

#include <jansson.h>
#include <stdbool.h>

typedef struct pln_chat pln_chat;

/* Loads the template at path: a .jinja file, a tokenizer_config.json, or a directory (a Hugging
 * Face model directory or a shard set) holding chat_template.jinja (preferred, as transformers
 * does) and/or tokenizer_config.json. The special tokens come from tokens_config (a
 * tokenizer_config.json) when given, else from path's own tokenizer_config.json (for a .jinja
 * file, the one beside it) if there is one. NULL + error when nothing loads or the template does
 * not parse (the error names the file, line and construct); *absent (if not NULL) is set true
 * when the reason is only that there is no template at all (a BLOOM model has none). */
pln_chat *pln_chat_load(const char *path, const char *tokens_config, bool *absent);
void pln_chat_free(pln_chat *c);
/* "DIR/tokenizer_config.json (chat_template)" or the .jinja path: where the template came from. */
const char *pln_chat_source(const pln_chat *c);

/* Renders the conversation. messages is a JSON array of message objects, passed as they are;
 * tools NULL (the template sees tools = none) or a JSON array; extra NULL or an object of more
 * variables (transformers' apply_chat_template **kwargs, vLLM's chat_template_kwargs, e.g.
 * {"enable_thinking": false}), which override the special tokens but may not name messages,
 * tools, documents or add_generation_prompt (check with pln_chat_check_extra first). Returns the
 * status of pln_jinja_render: OK with *out malloc'd (length *out_len), or RAISED (pln_error() is
 * the template's own message), ERROR or LIMIT (pln_error() names the line). */
pln_jinja_status pln_chat_render(const pln_chat *c, json_t *messages, json_t *tools, bool add_generation_prompt,
                                 json_t *extra, const pln_jinja_limits *lim, char **out, size_t *out_len);
/* 0 when extra (NULL or a JSON object) may be passed to pln_chat_render; -1 with an error naming
 * the first key it may not set, or saying it is not an object. */
int pln_chat_check_extra(json_t *extra);

#endif
