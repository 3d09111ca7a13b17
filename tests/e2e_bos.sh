#!/usr/bin/env bash
# e2e_bos.sh — text prompts get the tokenizer's post-processor, as Hugging Face applies it
# (tokenizer(text), TGI's /generate, vLLM's /v1/completions: add_special_tokens=True), and a
# rendered chat template does not (apply_chat_template(tokenize=True): the template writes
# bos_token itself). The llama-gqa fixture with its tokenizer.json given a Llama-style
# TemplateProcessing post-processor (<s> = id 1 before the text) and a chat template starting
# with {{ bos_token }}: /tokenize, /generate, /v1/completions, `pollen generate` and
# `pollen perplexity` see <s> exactly once; /v1/chat/completions does not double it;
# `add_special_tokens` on the OpenAI routes and --token-ids prompts are taken as given.
# (BLOOM's tokenizer.json has no post-processor: every BLOOM test covers that nothing changes.)
source "$(dirname "$0")/e2e.sh"
command -v curl >/dev/null && command -v python3 >/dev/null || { echo "SKIP: needs curl and python3"; e2e_done; exit 0; }
CURL="curl -s --max-time 30"
export OMP_NUM_THREADS=1
SRC=$TMP/src
cp -r tests/fixtures/models/llama-gqa/bf16-st "$SRC"
PP='"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}'
sed -i "s/\"post_processor\": null/$PP/" "$SRC/tokenizer.json"
cat >"$SRC/tokenizer_config.json" <<'J'
{"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": true,
 "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"}
J
check "the variant tokenizer adds <s> (id 1)" test "$("$POLLEN" tokenize "$SRC/tokenizer.json" --text 'This License' --add-special | cut -d' ' -f1)" = 1
check "reshard the set" "$POLLEN" reshard "$SRC" -o "$TMP/set" --tp 1 --dtype fp16 --quiet

# The text's own ids (no specials), and with <s>: what every text prompt must become.
IDS=$("$POLLEN" tokenize "$SRC/tokenizer.json" --text 'This License' | tr ' ' ',')
N=$(tr ',' '\n' <<<"$IDS" | grep -c .)
WANT="[1, ${IDS//,/, }]"
echo "text ids [$IDS], with BOS $WANT"
py() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# ---- pollen generate and perplexity -----------------------------------------------------------
"$POLLEN" generate "$TMP/set" --prompt "This License" --max-new-tokens 6 --json --quiet >"$TMP/g.json"
check "generate --prompt: prompt_ids start with one <s>" test "$(py 'd["results"][0]["prompt_ids"]' <"$TMP/g.json")" = "$WANT"
GEN=$(py 'd["results"][0]["ids"]' <"$TMP/g.json")
"$POLLEN" generate "$TMP/set" --token-ids "$IDS" --max-new-tokens 1 --json --quiet >"$TMP/t.json"
check "generate --token-ids: taken as given (no <s>)" test "$(py 'd["results"][0]["prompt_ids"]' <"$TMP/t.json")" = "[${IDS//,/, }]"
printf 'This License' >"$TMP/p.txt"
"$POLLEN" perplexity "$TMP/set" --file "$TMP/p.txt" --json --quiet >"$TMP/ppl.json"
check "perplexity: the text is encoded with <s> once ($((N + 1)) tokens)" test "$(py 'd["tokens"]' <"$TMP/ppl.json")" = $((N + 1))

# ---- the server --------------------------------------------------------------------------------
post() { $CURL -X POST -H 'Content-Type: application/json' "http://127.0.0.1:$PORT$1" -d "$2"; }
check "serve starts" start_server s "$POLLEN" serve "$TMP/set"
check "/tokenize: <s> once" test "$(post /tokenize '{"inputs":"This License"}' | py '[t["id"] for t in d]')" = "$WANT"
R=$(post /generate '{"inputs":"This License","parameters":{"max_new_tokens":6,"details":true,"decoder_input_details":true}}')
check "/generate: the prefill starts with one <s>" test "$(py '[t["id"] for t in d["details"]["prefill"]]' <<<"$R")" = "$WANT"
check "/generate: greedy tokens equal generate --prompt's" test "$(py '[t["id"] for t in d["details"]["tokens"]]' <<<"$R")" = "$GEN"
usage() { post /v1/completions "$1" | py 'd["usage"]["prompt_tokens"]'; }
check "/v1/completions: prompt_tokens counts <s> once" test "$(usage '{"prompt":"This License","max_tokens":1}')" = $((N + 1))
check "/v1/completions: a list of prompts, each with <s>" test "$(usage '{"prompt":["This License","This License"],"max_tokens":1}')" = $((2 * N + 2))
check "/v1/completions: add_special_tokens false adds nothing" \
  test "$(usage '{"prompt":"This License","max_tokens":1,"add_special_tokens":false}')" = "$N"
E=$(post /v1/completions '{"prompt":"This License","max_tokens":1,"echo":true,"logprobs":0,"temperature":0}')
check "/v1/completions echo: the text starts with the prompt" test "$(py 'd["choices"][0]["text"].startswith("This License")' <<<"$E")" = True
# chat: the template renders "<s>[user] This License\n"; encoded without specials it is the
# same ids as that text through completions with add_special_tokens false, and as the text
# after "<s>" with the default (the post-processor's <s> in place of the template's).
CH='{"messages":[{"role":"user","content":"This License"}],"max_tokens":1}'
C=$(post /v1/chat/completions "$CH" | py 'd["usage"]["prompt_tokens"]')
C1=$(usage '{"prompt":"<s>[user] This License\n","max_tokens":1,"add_special_tokens":false}')
C2=$(usage '{"prompt":"[user] This License\n","max_tokens":1}')
echo "chat prompt_tokens $C; rendered text without specials $C1; its text after <s> with them $C2"
check "/v1/chat/completions: bos_token written once, not doubled" test -n "$C" -a "$C" = "$C1" -a "$C" = "$C2"
CT=$(post /v1/chat/completions "${CH%\}},\"add_special_tokens\":true}" | py 'd["usage"]["prompt_tokens"]')
check "/v1/chat/completions: add_special_tokens true adds <s> before the template's" test "$CT" = $((C + 1))
check "/v1/completions: add_special_tokens must be a bool" \
  test "$($CURL -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt":"x","add_special_tokens":1}')" = 400
check "serve exits cleanly" stop_server
e2e_done
