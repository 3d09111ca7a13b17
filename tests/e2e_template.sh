#!/usr/bin/env bash
# e2e_template.sh — `pollen template`: a .jinja file, a tokenizer_config.json (string and list
# forms, "tool_use" picked when tools are given), an HF directory (chat_template.jinja preferred)
# and a shard set made by reshard, which carries tokenizer_config.json and chat_template.jinja
# checksummed in its manifest (an edited copy fails verify). Prompts are compared byte for byte
# (the engine itself is checked against jinja2 by test_jinja); refusals and bad input exit 1 with
# the template's message or the file and line.
source tests/e2e.sh
F=tests/fixtures/models/bloom-4h/fp16-st

CHATML='{% for m in messages %}{{ "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n" }}{% endfor %}{% if add_generation_prompt %}{{ "<|im_start|>assistant\n" }}{% endif %}'
printf '%s' "$CHATML" >"$TMP/chatml.jinja"
cat >"$TMP/m.json" <<'J'
[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Grüß dich 👋"}]
J
printf '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nGrüß dich 👋<|im_end|>\n<|im_start|>assistant\n' >"$TMP/want1"
"$POLLEN" template "$TMP/chatml.jinja" --messages "$TMP/m.json" >"$TMP/out1"; rc=$?
check ".jinja file exits 0" [ $rc = 0 ]
check ".jinja file: the prompt byte for byte (no newline added)" cmp "$TMP/out1" "$TMP/want1"
"$POLLEN" template "$TMP/chatml.jinja" --messages "$TMP/m.json" --no-generation-prompt >"$TMP/out2"
check "--no-generation-prompt drops the assistant header" [ "$(cat "$TMP/out2")" = "$(printf '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nGrüß dich 👋<|im_end|>\n')" ]

# tokenizer_config.json: the template as a string, the special tokens as strings or AddedToken objects
mkdir -p "$TMP/hf"
cat >"$TMP/hf/tokenizer_config.json" <<'J'
{"bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": null,
 "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}{% if pad_token is defined %}PAD{% endif %}"}
J
check "tokenizer_config.json: template + tokens" [ "$("$POLLEN" template "$TMP/hf/tokenizer_config.json" --messages "$TMP/m.json")" = "<s>[system] Be brief.</s>[user] Grüß dich 👋</s>" ]
check "HF directory: its tokenizer_config.json" [ "$("$POLLEN" template "$TMP/hf" --messages "$TMP/m.json")" = "<s>[system] Be brief.</s>[user] Grüß dich 👋</s>" ]
# chat_template.jinja beside it wins, and still sees the config's special tokens
printf '%s' '{{ bos_token }}jinja file: {{ messages | length }}' >"$TMP/hf/chat_template.jinja"
check "HF directory: chat_template.jinja preferred" [ "$("$POLLEN" template "$TMP/hf" --messages "$TMP/m.json")" = "<s>jinja file: 2" ]

# the list form: "default", and "tool_use" when tools are given (as transformers picks)
mkdir -p "$TMP/multi"
cat >"$TMP/multi/tokenizer_config.json" <<'J'
{"chat_template": [{"name": "default", "template": "default:{{ tools }}"},
                   {"name": "rag", "template": "{% frobnicate %}"},
                   {"name": "tool_use", "template": "tools:{{ tools | map(attribute='function.name') | join(',') }}"}]}
J
cat >"$TMP/tools.json" <<'J'
[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
J
check "list form: default without tools" [ "$("$POLLEN" template "$TMP/multi" --messages "$TMP/m.json")" = "default:None" ]
check "list form: tool_use with --tools" [ "$("$POLLEN" template "$TMP/multi" --messages "$TMP/m.json" --tools "$TMP/tools.json")" = "tools:get_weather" ]
printf '{"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "a"}}, {"function": {"name": "b"}}]}' >"$TMP/mt.json"
check "messages file with tools inside" [ "$("$POLLEN" template "$TMP/multi" --messages "$TMP/mt.json")" = "tools:a,b" ]

# more template variables: --kwargs, or "chat_template_kwargs" in the messages file
printf '%s' '{% if enable_thinking is defined and not enable_thinking %}no-think{% else %}think{% endif %}' >"$TMP/think.jinja"
check "no kwargs: the variable is undefined" [ "$("$POLLEN" template "$TMP/think.jinja" --messages "$TMP/m.json")" = "think" ]
check "--kwargs sets a variable" [ "$("$POLLEN" template "$TMP/think.jinja" --messages "$TMP/m.json" --kwargs '{"enable_thinking": false}')" = "no-think" ]
printf '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": false}}' >"$TMP/mk.json"
check "chat_template_kwargs in the messages file" [ "$("$POLLEN" template "$TMP/think.jinja" --messages "$TMP/mk.json")" = "no-think" ]
check_fails "--kwargs may not replace the messages" "may not set .messages." "$POLLEN" template "$TMP/think.jinja" --messages "$TMP/m.json" --kwargs '{"messages": []}'

# refusals and bad input
printf '%s' "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok" >"$TMP/nosys.jinja"
check_fails "raise_exception: the template's message" "refuses this conversation: System role not supported$" \
  "$POLLEN" template "$TMP/nosys.jinja" --messages "$TMP/m.json"
printf 'line one\n{%% for m in messages %%}\n{{ m.content | frobnicate }}\n{%% endfor %%}' >"$TMP/badfilter.jinja"
check_fails "an unknown filter: file, line and name" "badfilter.jinja:3: the filter 'frobnicate' is not supported" \
  "$POLLEN" template "$TMP/badfilter.jinja" --messages "$TMP/m.json"
printf 'a\n\n{%% include "other.jinja" %%}' >"$TMP/include.jinja"
check_fails "an unsupported tag is refused at load with its line" "include.jinja:3: the \{% include %\} tag is not supported" \
  "$POLLEN" template "$TMP/include.jinja" --messages "$TMP/m.json"
mkdir -p "$TMP/none"; echo '{"bos_token": "<s>"}' >"$TMP/none/tokenizer_config.json"
check_fails "a directory without a template" "has no \"chat_template\"" "$POLLEN" template "$TMP/none" --messages "$TMP/m.json"
echo '{"role": "user"}' >"$TMP/notarray.json"
check_fails "messages must be an array" "expected a JSON array of messages" "$POLLEN" template "$TMP/chatml.jinja" --messages "$TMP/notarray.json"
echo '[{"content": "no role"}]' >"$TMP/norole.json"
check_fails "each message needs a role" "message 0 must be an object with a string \"role\"" "$POLLEN" template "$TMP/chatml.jinja" --messages "$TMP/norole.json"
echo '[1, 2' >"$TMP/broken.json"
check_fails "broken JSON names the file" "broken.json: not valid JSON" "$POLLEN" template "$TMP/chatml.jinja" --messages "$TMP/broken.json"
check_fails "--messages is required" "^pollen template: missing required option --messages \\(see pollen template --help\\)" "$POLLEN" template "$TMP/chatml.jinja"
"$POLLEN" template "$TMP/chatml.jinja" >/dev/null 2>&1; check "usage error exits 2" [ $? = 2 ]

# reshard carries tokenizer_config.json and chat_template.jinja into the set, checksummed
cp -r "$F" "$TMP/ck"
cp "$TMP/hf/tokenizer_config.json" "$TMP/hf/chat_template.jinja" "$TMP/ck/"
check "reshard with a chat template" "$POLLEN" reshard "$TMP/ck" -o "$TMP/set" --tp 2 --dtype fp16 --quiet
check "the set holds tokenizer_config.json" cmp "$TMP/ck/tokenizer_config.json" "$TMP/set/tokenizer_config.json"
check "the set holds chat_template.jinja" cmp "$TMP/ck/chat_template.jinja" "$TMP/set/chat_template.jinja"
check "manifest records their checksums" grep -q '"chat_template_xxh3": "[0-9a-f]\{16\}"' "$TMP/set/manifest.json"
check "manifest records tokenizer_config" grep -q '"tokenizer_config_xxh3": "[0-9a-f]\{16\}"' "$TMP/set/manifest.json"
check "verify passes" "$POLLEN" verify "$TMP/set"
check "template on the shard set" [ "$("$POLLEN" template "$TMP/set" --messages "$TMP/m.json")" = "<s>jinja file: 2" ]
printf '{{ 1 }}' >"$TMP/set/chat_template.jinja"
check_fails "an edited chat_template.jinja fails verify, named" "chat_template.jinja" "$POLLEN" verify "$TMP/set"
check_fails "pollen template checks the set's checksums too" "chat_template.jinja" "$POLLEN" template "$TMP/set" --messages "$TMP/m.json"
# a checkpoint without them: the set has none, and says nothing of them
check "reshard without a chat template" "$POLLEN" reshard "$F" -o "$TMP/set2" --tp 1 --dtype fp16 --quiet
check "no chat files in that set" [ ! -e "$TMP/set2/tokenizer_config.json" -a ! -e "$TMP/set2/chat_template.jinja" ]
check "its manifest has no chat keys" bash -c "! grep -q chat_template '$TMP/set2/manifest.json'"
check "verify passes without them" "$POLLEN" verify "$TMP/set2"
e2e_done
