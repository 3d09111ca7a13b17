#!/usr/bin/env bash
# e2e_opts.sh — the option conventions every command shares (tools/opt.c): `--opt value` and
# `--opt=value` give the same result, short forms (-o -t -q -p -n -s -m -c) work, `--` ends the
# options; an unknown option gets one wording with a suggestion, a missing value and a missing
# required option are named in one line, exit 2, printed once under mpirun; serve takes TGI/vLLM
# names as aliases and a POLLEN_<NAME> environment variable for every option (argv wins).
source "$(dirname "$0")/e2e.sh"
export OMP_NUM_THREADS=1
F=tests/fixtures/models/bloom-4h
TOK=$F/fp16-st/tokenizer.json
P=$(cd "$(dirname "$POLLEN")" && pwd)/$(basename "$POLLEN")
# check_usage "what" "expected stderr regex" cmd...: exit 2 and the message
check_usage() {
  local what=$1 re=$2; shift 2
  local err; err=$("$@" 2>&1 >/dev/null); local rc=$?
  if [ $rc = 2 ] && grep -Eq -- "$re" <<<"$err"; then E2E_PASS=$((E2E_PASS+1));
  else E2E_FAIL=$((E2E_FAIL+1)); echo "FAIL: $what (rc=$rc, stderr: $err)" >&2; fi
}
same() { [ "$1" = "$2" ] && [ -n "$1" ]; }
ids() { jq -c '[.results[].ids]'; }

# ---- both spellings and the short forms give the same result ----------------------------------
check "reshard --output=SET --tp=1 --dtype=fp16" "$P" reshard $F/fp16-st --output="$TMP/s1" --tp=1 --dtype=fp16 --quiet
check "reshard -o SET -t 1 -q (short forms)" "$P" reshard $F/fp16-st -o "$TMP/s2" --tp 2 --dtype fp16 -t 1 -q
check "reshard: the two sets are TP 1 and TP 2" bash -c "jq -e '.tp == 1' '$TMP/s1/manifest.json' >/dev/null && jq -e '.tp == 2' '$TMP/s2/manifest.json' >/dev/null"
a=$("$P" generate "$TMP/s1" --prompt=Hello --max-new-tokens=4 --temperature=0.9 --seed=7 --json --quiet | ids)
b=$("$P" generate -m "$TMP/s1" -p Hello -n 4 --temperature 0.9 -s 7 --json -q | ids)
c=$("$P" generate "$TMP/s1" -pHello -n4 --temperature 0.9 -s7 --json -q | ids)
d=$("$P" generate "$TMP/s1" -p Hello -n 4 --temperature 0.9 -s 8 --json -q | ids)
check "generate: --opt=value and -x value sample the same ids ($a)" same "$a" "$b"
check "generate: -xVALUE too" same "$a" "$c"
check "generate: 4 new tokens" test "$(jq '.[0] | length' <<<"$a")" = 4
check "generate: the seed reaches the sampler (seed 8 differs)" test "$a" != "$d"
e=$("$P" generate "$TMP/s1" -p Hello -p Hi -n 2 --json -q | jq '.results | length')
check "generate: -p is repeatable" test "$e" = 2
a=$("$P" tokenize "$TOK" --text=hello); b=$("$P" tokenize "$TOK" --text hello)
check "tokenize: --text=hello and --text hello ($a)" same "$a" "$b"
cp "$TOK" "$TMP/-tok.json"
c=$(cd "$TMP" && "$P" tokenize --text hello -- -tok.json)
check "tokenize: -- ends the options (a path starting with a dash)" same "$a" "$c"
a=$("$P" inspect "$TMP/s1" --tensor=word_embeddings.weight --head=3); b=$("$P" inspect "$TMP/s1" --tensor word_embeddings.weight -n 3)
check "inspect: --head=3 and -n 3" same "$a" "$b"
a=$("$P" perplexity "$TMP/s1" --file=$F/reference-ppl.txt --ctx=16 --json -q | jq .perplexity)
b=$("$P" perplexity -m "$TMP/s1" -f $F/reference-ppl.txt -c 16 --json -q | jq .perplexity)
check "perplexity: --ctx=16 and -c 16 ($a)" same "$a" "$b"
check "verify -q -t 1" "$P" verify "$TMP/s1" -q -t 1

# ---- one wording for every command ------------------------------------------------------------
check_usage "generate: did you mean" '^pollen generate: unknown option --max-new-token \(did you mean --max-new-tokens\?\)$' \
  "$P" generate "$TMP/s1" -p hi --max-new-token 3
check_usage "generate: see --help" '^see pollen generate --help$' "$P" generate "$TMP/s1" -p hi --max-new-token 3
check_usage "generate: =value not echoed" 'unknown option --max-new-token \(did' "$P" generate "$TMP/s1" -p hi --max-new-token=3
while read -r cmd typo want args; do
  # shellcheck disable=SC2086
  check_usage "$cmd: unknown option $typo suggests $want" "^pollen $cmd: unknown option $typo \(did you mean $want\?\)$" \
    "$P" $cmd $args $typo x
done <<EOF
inspect --tensr --tensor $TMP/s1
reshard --dtyp --dtype $F/fp16-st -o $TMP/x --tp 1
verify --sorce --source $TMP/s1
synth --layer --layers -o $TMP/x
generate --temprature --temperature $TMP/s1
serve --kv-token --kv-tokens $TMP/s1
bench --prompt-lenn --prompt-len $TMP/s1
perplexity --strid --stride $TMP/s1
tokenize --add-specal --add-special $TOK
template --mesages --messages $TMP/x
serve --max-num-seq --max-num-seqs $TMP/s1
serve --hostnme --hostname $TMP/s1
EOF
check_usage "a mistyped command gets a suggestion too" "^pollen: unknown command 'genrate' \\(did you mean generate\\?\\)$" "$P" genrate
check_usage "an unknown command with nothing close: the commands in one line" \
  "^pollen: unknown command 'frobnicate' \\(commands: inspect reshard verify synth generate serve bench perplexity tokenize template\\)$" \
  "$P" frobnicate
check "an unknown command: no usage dump" bash -c "! '$P' frobnicate 2>&1 | grep -q usage:"
check_usage "no suggestion when nothing is close" '^pollen serve: unknown option --frobnicate$' "$P" serve "$TMP/s1" --frobnicate
check_usage "an unknown short option" '^pollen reshard: unknown option -z$' "$P" reshard $F/fp16-st -z
check_usage "a missing value" '^pollen generate: --prompt needs a value$' "$P" generate "$TMP/s1" --prompt
check_usage "a missing value (short)" '^pollen generate: --max-new-tokens needs a value$' "$P" generate "$TMP/s1" -p hi -n
check_usage "reshard: the missing option is named" '^pollen reshard: missing required option --tp \(see pollen reshard --help\)$' \
  "$P" reshard $F/fp16-st -o "$TMP/x" --dtype fp16
check "reshard: no usage dump on an error" bash -c "! '$P' reshard $F/fp16-st -o '$TMP/x' --dtype fp16 2>&1 | grep -q usage:"
check_usage "synth: --model named" '^pollen synth: missing required option --model' "$P" synth -o "$TMP/x"
check_usage "generate: a missing SET" '^pollen generate: missing SET \(see pollen generate --help\)$' "$P" generate -p hi
check_usage "generate: a missing prompt" '^pollen generate: missing required option --prompt' "$P" generate "$TMP/s1"
check_usage "a flag given a value" '^pollen inspect: --json takes no value' "$P" inspect "$TMP/s1" --json=1
check_usage "SET twice" '^pollen bench: SET given twice' "$P" bench "$TMP/s1" -m "$TMP/s2"
check_usage "a stray argument" '^pollen verify: unexpected argument extra' "$P" verify "$TMP/s1" extra
check_usage "a bad value keeps its message" '^pollen: --top-p 2: out of range' "$P" generate "$TMP/s1" -p hi --top-p=2
check "--help wins over a mistake (exit 0)" bash -c "'$P' generate --bogus --help | grep -q '^usage:'"
if command -v mpirun >/dev/null; then
  err=$(mpirun -np 2 "$P" generate "$TMP/s2" -p hi --max-new-token 3 2>&1 >/dev/null)
  check "under mpirun the error is printed once" test "$(grep -c 'unknown option' <<<"$err")" = 1
  err=$(mpirun -np 2 "$P" serve "$TMP/s2" --max-seqs=0 2>&1 >/dev/null)
  check "under mpirun a bad value is printed once" test "$(grep -c 'max-seqs 0: out of range' <<<"$err")" = 1
  a=$(mpirun -np 2 "$P" generate "$TMP/s2" -p Hello -n3 --json -q | ids)
  b=$("$P" generate "$TMP/s1" --prompt=Hello --max-new-tokens=3 --json -q | ids)
  check "TP 2 under mpirun with short forms = TP 1 ($a)" same "$a" "$b"
fi

# ---- serve: aliases and environment variables -------------------------------------------------
check_usage "serve: --num-shard checked against the set" 'num-shard 2, but .*/s1 is a TP-1 set' \
  "$P" serve "$TMP/s1" --num-shard 2
check_usage "serve: --tensor-parallel-size too" 'tensor-parallel-size 3, but .*/s2 is a TP-2 set' \
  "$P" serve "$TMP/s2" --tensor-parallel-size=3
check_usage "serve: a bad POLLEN_PORT names the variable" '^pollen: POLLEN_PORT: --port "abc": not an integer' \
  env POLLEN_PORT=abc "$P" serve "$TMP/s1"
check_usage "serve: a bad flag variable" 'POLLEN_NO_PREFIX_CACHE=maybe' env POLLEN_NO_PREFIX_CACHE=maybe "$P" serve "$TMP/s1"
check_usage "serve: --model-id that is not a set, no SET" 'missing SET \(--model-id org/model is not a shard set' \
  "$P" serve --model-id org/model
h=$("$P" serve --help | tr '\n' ' ' | tr -s ' ')
for w in POLLEN_PORT POLLEN_HOST POLLEN_KV_TOKENS POLLEN_MAX_SEQS '(also --hostname)' '(also --max-batch-total-tokens)' \
  '(also --max-num-seqs)' '(also --num-shard)'; do
  check "serve --help lists $w" grep -qF -- "$w" <<<"$h"
done
check "serve --help: no test-only variable" bash -c "! grep -q POLLEN_FAIL_AT_STEP <<<\"\$1\"" _ "$h"
# aliases and the environment reach the engine: the start-up line shows slots and KV blocks
if check "serve: POLLEN_MAX_SEQS, --hostname, --max-batch-total-tokens" start_server a POLLEN_MAX_SEQS=3 POLLEN_BLOCK_SIZE=8 \
    "$P" serve "$TMP/s1" --hostname 127.0.0.1 --max-batch-total-tokens 256; then
  check "serve: 3 slots, 32 KV blocks of 8" grep -q '\[3 slots, 32 KV blocks of 8,' "$TMP/a.log"
  stop_server
fi
if check "serve: --model-id SET (TGI), argv over POLLEN_MAX_SEQS" start_server b POLLEN_MAX_SEQS=3 \
    "$P" serve --model-id "$TMP/s1" --max-num-seqs 5; then
  check "serve: the set from --model-id, named by its directory; 5 slots" grep -q '^pollen serve: s1 (tp 1.*\[5 slots' "$TMP/b.log"
  stop_server
fi
if check "serve: POLLEN_MODEL_ID is the display name beside a SET" start_server c POLLEN_MODEL_ID=my-model "$P" serve "$TMP/s1"; then
  check "serve: reported as my-model" grep -q '^pollen serve: my-model (tp 1' "$TMP/c.log"
  stop_server
fi
e2e_done
