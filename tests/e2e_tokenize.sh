#!/usr/bin/env bash
# e2e_tokenize.sh — `pollen tokenize` on the tokenizer fixtures (the real Mistral, Llama 3 and Qwen2
# vocabularies, BLOOM's pipeline) given as a tokenizer.json, a Hugging Face directory and a shard
# set: ids as Hugging Face tokenizers gives them (values from tests/fixtures/tokenizer/*/cases.json.gz),
# --add-special, --json, stdin bytes exact, --decode byte for byte, and bad input.
source tests/e2e.sh
FIX=tests/fixtures/tokenizer

for f in mistral llama3 qwen2; do gzip -dc "$FIX/$f/tokenizer.json.gz" >"$TMP/$f.json"; done
MIS=$TMP/mistral.json

tok() { "$POLLEN" tokenize "$@"; }
eq() { [ "$1" = "$2" ] || { echo "  got:  $1" >&2; echo "  want: $2" >&2; return 1; }; }

# ---- encode -----------------------------------------------------------------------------------
check "mistral: Hello world" eq "$(tok "$MIS" --text 'Hello world')" "22557 1526"
check "mistral: --add-special adds <s>" eq "$(tok "$MIS" --text 'Hello world' --add-special)" "1 22557 1526"
check "mistral: --json" eq "$(tok "$MIS" --text 'Hello world' --add-special --json)" \
  '{"ids":[1,22557,1526],"tokens":["<s>","\u2581Hello","\u2581world"]}'
check "mistral: stdin keeps its trailing newline (byte fallback <0x0A>)" eq "$(printf 'Hello world\n' | tok "$MIS")" "22557 1526 13"
check "mistral: empty stdin gives no ids" eq "$(printf '' | tok "$MIS")" ""
check "llama3: Hello world" eq "$(tok "$TMP/llama3.json" --text 'Hello world')" "9906 1917"
check "llama3: --add-special adds <|begin_of_text|>" eq "$(tok "$TMP/llama3.json" --text 'Hello world' --add-special)" \
  "128000 9906 1917"
check "llama3: digits in groups of three" eq "$(tok "$TMP/llama3.json" --text 1234567890123456789012345678901234567890)" \
  "4513 10961 16474 11531 12901 17458 19319 11727 19282 21381 4513 10961 16474 15"
check "llama3: <|eot_id|> inside text" eq "$(tok "$TMP/llama3.json" --text 'Hello world<|eot_id|>')" "9906 1917 128009"
check "qwen2: ZWJ family emoji" eq "$(printf '\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7\xe2\x80\x8d\xf0\x9f\x91\xa6' | tok "$TMP/qwen2.json")" \
  "145367 378 235 145233 378 235 145665 378 235 145988"
check "qwen2: digits one by one" eq "$(tok "$TMP/qwen2.json" --text 12345)" "16 17 18 19 20"
check "qwen2: no BOS to add" eq "$(tok "$TMP/qwen2.json" --text 'Hello world' --add-special)" "9707 1879"

# ---- PATH forms: a Hugging Face directory, a shard set ----------------------------------------
mkdir -p "$TMP/hf"
cp "$MIS" "$TMP/hf/tokenizer.json"
check "a Hugging Face directory reads its tokenizer.json" eq "$(tok "$TMP/hf" --text 'Hello world')" "22557 1526"
check "BLOOM fixture: Hello world" eq "$(tok $FIX/tokenizer.json --text 'Hello world')" "679 511"
if "$POLLEN" reshard tests/fixtures/models/bloom-4h/fp16-st -o "$TMP/set" --tp 1 --dtype fp16 --quiet 2>"$TMP/reshard.log"; then
  check "a shard set uses the tokenizer it carries" eq "$(tok "$TMP/set" --text 'Hello world')" "679 511"
else
  check "reshard bloom-4h for the shard-set form" false
  cat "$TMP/reshard.log" >&2
fi

# ---- decode: exact bytes, no newline added ----------------------------------------------------
text=$'Fa\xc3\xa7ade \xe2\x82\xac 12345 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd\n\ttabs  and\n\n  spaces \xe6\x97\xa5\xe6\x9c\xac\n'
printf '%s' "$text" >"$TMP/text.txt"
for f in mistral llama3 qwen2; do
  tok "$TMP/$f.json" <"$TMP/text.txt" >"$TMP/$f.ids"
  tok "$TMP/$f.json" --decode <"$TMP/$f.ids" >"$TMP/$f.back"
  check "$f: decode(encode(text)) is the text byte for byte" cmp -s "$TMP/text.txt" "$TMP/$f.back"
done
check "mistral: byte-fallback pieces decode to one character" eq "$(tok "$MIS" --decode --text '229,133,175' | od -An -tx1 | tr -d ' \n')" "e282ac"
check "mistral: a cut-short byte run is one U+FFFD per byte" eq "$(tok "$MIS" --decode --text '229 133' | od -An -tx1 | tr -d ' \n')" "efbfbdefbfbd"
check "mistral: <s> is kept, Strip drops the leading space" eq "$(tok "$MIS" --decode --text '1 22557 1526')" "<s> Hello world"
check "mistral: --skip-special" eq "$(tok "$MIS" --decode --skip-special --text '[1, 22557, 1526]')" "Hello world"
check "decode adds no newline" eq "$(tok "$MIS" --decode --text '22557' | od -An -c | tr -d ' \n')" "Hello"
check "--decode --json" eq "$(tok "$MIS" --decode --json --text '22557 13')" '{"text":"Hello\n"}'

# ---- bad input --------------------------------------------------------------------------------
check_fails "a word among the ids" 'item 2\) is not a token id.*\[0, 32000\)' tok "$MIS" --decode --text '1 abc 3'
check_fails "an id past the vocabulary" '"32000" \(item 1\) is not a token id' tok "$MIS" --decode --text '32000'
check_fails "a negative id" '"-1" \(item 1\) is not a token id' tok "$MIS" --decode --text '-1'
check_fails "unknown file" '/nonexistent/tokenizer.json: No such file or directory \(give a tokenizer.json' \
  tok /nonexistent/tokenizer.json --text hi
mkdir -p "$TMP/empty"
check_fails "a directory without tokenizer.json" 'empty: no tokenizer.json in this directory' tok "$TMP/empty" --text hi
check_fails "invalid UTF-8 on stdin" 'stdin: .*not valid UTF-8 \(byte 0xff at offset 2\)' sh -c "printf 'ab\377' | $POLLEN tokenize $MIS"
sed 's/"type": "Metaspace"/"type": "UnicodeScripts"/' "$MIS" >"$TMP/bad.json"
check_fails "an unsupported component is named with its JSON path" \
  'bad.json: pre_tokenizer: pre_tokenizer "UnicodeScripts" is not supported by pollen' tok "$TMP/bad.json" --text hi
printf '{"model": [1, 2' >"$TMP/junk.json"
check_fails "a file that is not JSON" 'junk.json: not valid JSON' tok "$TMP/junk.json" --text hi
check_fails "no path is a usage error" '^pollen tokenize: missing SET[|]CHECKPOINT[|]TOKENIZER.json \(see pollen tokenize --help\)' tok
check_fails "--skip-special without --decode" 'skip-special goes with --decode' tok "$MIS" --skip-special --text hi

e2e_done
