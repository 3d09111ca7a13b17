#!/usr/bin/env bash
# e2e_serve.sh — `pollen serve` over real HTTP on 127.0.0.1 with the real engine on small shard
# sets: answers match `pollen generate`, streamed == non-streamed, identical concurrent greedy
# requests, validation codes, overload → 429, a client disconnect frees its slot and KV blocks,
# an injected forward failure → error event + /health 503 + memory freed, SIGTERM drains and
# every rank exits 0, and a TP-2 server under mpirun answers like a TP-1 server.
# Ports are chosen by the kernel (--port 0 --port-file); every wait is bounded.
source "$(dirname "$0")/e2e.sh"
HELPER=${PLN_BUILD:-build}/tests/test_shard
command -v curl >/dev/null || { echo "SKIP: curl not installed (make deps)"; e2e_done; exit; }
[ -x "$HELPER" ] || { echo "SKIP: $HELPER not built"; e2e_done; exit; }
CURL="curl -s --max-time 30"

wait_metric() { # name value seconds (what a quiet machine needs; at least 30 s is allowed: a hang guard)
  local n=$(( $3 * 20 )); [ $n -lt 600 ] && n=600
  for _ in $(seq $n); do [ "$(metric "$1")" = "$2" ] && return 0; sleep 0.05; done
  echo "metric $1 = $(metric "$1"), want $2" >&2; return 1
}
ids_of() { grep -o '"id":[0-9]*' | sed 's/"id"://' | tr '\n' ',' ; }
gen_text() { sed -n 's/.*"generated_text":"\(.*\)"[,}].*/\1/p' | sed 's/","details.*//' | tail -n 1; }
post() { $CURL -X POST -H 'Content-Type: application/json' "http://127.0.0.1:$PORT$1" -d "$2"; }
code() { $CURL -o "$TMP/body" -w '%{http_code}' -X POST "http://127.0.0.1:$PORT$1" -d "$2"; }

S1=$TMP/s1; S2=$TMP/s2
check "sample TP-1 set" "$HELPER" --write-sample "$S1" --tp 1
check "sample TP-2 set" "$HELPER" --write-sample "$S2" --tp 2

# ---- TP 1: routes, agreement with pollen generate, streaming, concurrency, validation ----------
check "server starts (TP 1)" start_server a "$POLLEN" serve "$S1" --max-concurrent-requests 8
check "GET /health 200" test "$($CURL -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 200
check "/info reports tp 1 and limits" grep -q '"tp":1,.*"max_concurrent_requests":8' <<<"$($CURL http://127.0.0.1:$PORT/info)"
check "/v1/models lists the set" grep -q '"id":"s1"' <<<"$($CURL http://127.0.0.1:$PORT/v1/models)"

REQ='{"inputs":"Hello world","parameters":{"max_new_tokens":12,"details":true}}'
SRV_IDS=$(post /generate "$REQ" | sed 's/.*"tokens"://' | ids_of)
GEN_IDS=$("$POLLEN" generate "$S1" --prompt "Hello world" --max-new-tokens 12 --temperature 0 --json --quiet 2>/dev/null |
          sed 's/.*"ids":\[\([0-9,]*\)\].*/\1/'),
check "server tokens == pollen generate ($SRV_IDS vs $GEN_IDS)" test -n "$GEN_IDS" -a "$SRV_IDS" = "$GEN_IDS"

for p in "Hello world" "The quick brown fox" "a"; do
  B="{\"inputs\":\"$p\",\"parameters\":{\"max_new_tokens\":16}}"
  T1=$(post /generate "$B" | gen_text)
  T2=$(post /generate_stream "$B" | grep '^data:' | tail -n 1 | gen_text)
  N=$(post /generate_stream "$B" | grep -c '^data:')
  check "stream == non-stream for '$p'" test -n "$T1" -a "$T1" = "$T2"
  check "one event per token ($N)" test "$N" = 16
done
O1=$(post /v1/completions '{"prompt":"Hello","max_tokens":10,"temperature":0}' | sed 's/.*"text":"\(.*\)","index".*/\1/')
OS=$(post /v1/completions '{"prompt":"Hello","max_tokens":10,"temperature":0,"stream":true}')
check "openai stream ends with [DONE]" test "$(grep '^data:' <<<"$OS" | tail -n 1)" = "data: [DONE]"
O2=$(grep '^data: {' <<<"$OS" | sed 's/.*"text":"\(.*\)","index".*/\1/' | tr -d '\n')
check "openai stream == non-stream" test -n "$O1" -a "$O1" = "$O2"

pids=()
for i in 1 2 3 4; do post /generate '{"inputs":"same","parameters":{"max_new_tokens":24}}' >"$TMP/c$i" & pids+=($!); done
wait "${pids[@]}"
check "4 concurrent greedy requests: identical text" bash -c "cmp -s $TMP/c1 $TMP/c2 && cmp -s $TMP/c1 $TMP/c3 && cmp -s $TMP/c1 $TMP/c4 && grep -q generated_text $TMP/c1"

check "malformed JSON -> 422" test "$(code /generate '{oops')" = 422
check "message names the problem" grep -q 'malformed JSON' "$TMP/body"
check "max_new_tokens 0 -> 422" test "$(code /generate '{"inputs":"x","parameters":{"max_new_tokens":0}}')" = 422
check "top_p NaN string -> 422" test "$(code /generate '{"inputs":"x","parameters":{"top_p":"NaN"}}')" = 422
check "empty inputs -> 422" test "$(code /generate '{"inputs":""}')" = 422
check "non-object body -> 422" test "$(code /generate '[1]')" = 422
check "openai bad temperature -> 400" test "$(code /v1/completions '{"prompt":"x","temperature":9}')" = 400
check "openai error shape" grep -q '"error":{"message":.*"type":"invalid_request_error","param":"temperature"' "$TMP/body"
check "openai unknown model -> 404" test "$(code /v1/completions '{"prompt":"x","model":"nope"}')" = 404
# Every sampling parameter at its extremes is a 200 or a 4xx naming it, never a 5xx or a dead
# server: top_k INT32_MAX once overflowed its +1 and killed the process; a temperature whose
# inverse is infinite in float came back as a 424 blaming the weights (now greedy, as below 1e-5).
GREEDY=$(post /generate '{"inputs":"Hello world","parameters":{"max_new_tokens":6}}' | gen_text)
for body in '"top_k":2147483647' '"top_k":1' '"temperature":1e-40' '"temperature":1e-38' '"temperature":100' \
            '"top_p":1e-30' '"top_p":1' '"typical_p":1e-30' '"typical_p":0.9999' '"repetition_penalty":1e-5' \
            '"repetition_penalty":100' '"seed":9223372036854775807' '"seed":0' '"top_n_tokens":5' '"truncate":1' \
            '"best_of":2,"do_sample":true' '"do_sample":true,"top_k":2147483647,"top_p":1e-30'; do
  for route in /generate /generate_stream; do
    [ $route = /generate_stream ] && [[ $body == *best_of* ]] && continue   # TGI: no best_of when streaming
    c=$(code $route "{\"inputs\":\"Hello world\",\"parameters\":{\"max_new_tokens\":6,$body}}")
    check "$route {$body}: 200 ($c)" test "$c" = 200
    check "$route {$body}: no error in the body" bash -c "! grep -q '\"error\"' '$TMP/body'"
  done
done
for t in 1e-40 1e-38 1e-30; do
  check "temperature $t is greedy" test "$(post /generate "{\"inputs\":\"Hello world\",\"parameters\":{\"max_new_tokens\":6,\"temperature\":$t,\"do_sample\":true}}" | gen_text)" = "$GREEDY"
done
check "repetition_penalty 1e-6 -> 422" test "$(code /generate '{"inputs":"x","parameters":{"repetition_penalty":1e-6}}')" = 422
check "... naming it" grep -q 'repetition_penalty' "$TMP/body"
for body in '"top_k":2147483647' '"temperature":1e-45' '"temperature":2' '"top_p":1e-30' '"n":2' '"best_of":2' \
            '"logprobs":5' '"presence_penalty":2' '"presence_penalty":-2' '"frequency_penalty":2' '"frequency_penalty":-2' \
            '"seed":9223372036854775807' '"seed":0'; do
  c=$(code /v1/completions "{\"prompt\":\"Hello\",\"max_tokens\":4,$body}")
  check "/v1/completions {$body}: 200 ($c)" test "$c" = 200
done
check "pollen generate --top-k 2147483647" "$POLLEN" generate "$S1" --prompt "Hello" --max-new-tokens 3 --top-k 2147483647 --seed 1 --quiet
check "pollen generate --temperature 1e-40 is greedy" test \
  "$("$POLLEN" generate "$S1" --prompt "Hello world" --max-new-tokens 6 --temperature 1e-40 --json --quiet 2>/dev/null | sed 's/.*"ids":\[\([0-9,]*\)\].*/\1/')" = \
  "$("$POLLEN" generate "$S1" --prompt "Hello world" --max-new-tokens 6 --temperature 0 --json --quiet 2>/dev/null | sed 's/.*"ids":\[\([0-9,]*\)\].*/\1/')"
GENERR=$($CURL "http://127.0.0.1:$PORT/metrics" | awk '/^pln_requests_total\{.*outcome="generation_error"\}/ {n += $2} END {print n + 0}')
check "no request counted as a generation error ($GENERR)" test "$GENERR" = 0
head -c 2000000 /dev/zero | tr '\0' 'a' >"$TMP/big"
check "oversized body -> 413" test "$($CURL -o /dev/null -w '%{http_code}' -X POST http://127.0.0.1:$PORT/generate --data-binary @"$TMP/big")" = 413
check "still healthy after bad requests" test "$($CURL -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 200
check "SIGTERM: clean exit (TP 1)" stop_server
# a line per request (default text form), refused requests too
check "request line of a generation" grep -Eq '^pollen serve: request id=cmpl-[0-9a-f]+ method=POST path=/generate route=generate status=200 outcome=success tokens_in=[1-9][0-9]* tokens_out=12 queue_ms=[0-9.]+ inference_ms=[0-9.]+ total_ms=[0-9.]+$' "$TMP/a.log"
check "request line of a 422" grep -Eq '^pollen serve: request id=req-[0-9a-f]+ method=POST path=/generate route=generate status=422 outcome=validation_error tokens_in=0 tokens_out=0 queue_ms=- inference_ms=- total_ms=' "$TMP/a.log"
check "request line of a 413" grep -q 'route=generate status=413 ' "$TMP/a.log"
check "request lines of streams" grep -q 'path=/generate_stream route=generate_stream status=200 outcome=success tokens_in=[0-9]* tokens_out=16 ' "$TMP/a.log"

# ---- --api-key / POLLEN_API_KEY, --log-format json, HEAD, the new routes, --host ---------------
KEY=e2e-Key-7f3a
check "server starts (POLLEN_API_KEY, --log-format json, --host localhost)" start_server k1 POLLEN_API_KEY=$KEY "$POLLEN" serve "$S1" --log-format json --host localhost
check "start-up line names localhost" grep -q "on http://localhost:$PORT " "$TMP/k1.log"
AUTH="Authorization: Bearer $KEY"
hcode() { $CURL -o "$TMP/body" -D "$TMP/head" -w '%{http_code}' "$@"; }
check "/generate without the key -> 401" test "$(hcode -X POST "http://127.0.0.1:$PORT/generate" -d '{"inputs":"Hello"}')" = 401
check "... WWW-Authenticate: Bearer" grep -qi '^WWW-Authenticate: Bearer' "$TMP/head"
check "... TGI error shape" grep -q '"error_type":"unauthorized"' "$TMP/body"
check "/v1/completions with a wrong key -> 401" test "$(hcode -H 'Authorization: Bearer nope' -X POST "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt":"Hello"}')" = 401
check "... OpenAI error shape" grep -q '"code":"invalid_api_key"' "$TMP/body"
check "/v1/models without the key -> 401" test "$(hcode "http://127.0.0.1:$PORT/v1/models")" = 401
check "/generate with the key -> 200" test "$(hcode -H "$AUTH" -X POST "http://127.0.0.1:$PORT/generate" -d '{"inputs":"Hello","parameters":{"max_new_tokens":3}}')" = 200
check "/v1/completions with token ids and the key -> 200" test "$(hcode -H "$AUTH" -X POST "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt":[[5,6,7],[8]],"max_tokens":2}')" = 200
check "... two choices" test "$(grep -o '"index":' "$TMP/body" | wc -l)" = 2
check "/detokenize with the key -> 200" test "$(hcode -H "$AUTH" -X POST "http://127.0.0.1:$PORT/detokenize" -d '{"tokens":[5,6,7]}')" = 200
check "... {\"prompt\"}" grep -q '^{"prompt":".*"}$' "$TMP/body"
for r in health info metrics version docs openapi.json; do
  check "GET /$r is open -> 200" test "$(hcode "http://127.0.0.1:$PORT/$r")" = 200
  check "HEAD /$r -> 200, no body" test "$($CURL -I -o "$TMP/hb" -w '%{http_code}' "http://127.0.0.1:$PORT/$r")" = 200 -a "$(grep -ci '^content-length: 0' "$TMP/hb")" = 0
done
check "/version" grep -q '^{"version":"[0-9.]*"}$' <<<"$($CURL "http://127.0.0.1:$PORT/version")"
check "/openapi.json is docs/openapi.json" cmp -s docs/openapi.json <($CURL "http://127.0.0.1:$PORT/openapi.json")
check "/info does not show the key" bash -c "! grep -q '$KEY' <<<\"\$1\"" _ "$($CURL "http://127.0.0.1:$PORT/info")"
check "SIGTERM: exits 0 (API key)" stop_server
check "JSON request lines: a 401 and a 200 on /generate" bash -c "grep -q '\"route\":\"generate\",\"status\":401,\"outcome\":\"unauthorized\"' '$TMP/k1.log' && grep -q '\"route\":\"generate\",\"status\":200,\"outcome\":\"success\",\"tokens_in\":[0-9]*,\"tokens_out\":3,' '$TMP/k1.log'"
if command -v python3 >/dev/null; then
  check "every JSON request line parses" python3 -c 'import json, sys
n = 0
for l in open(sys.argv[1]):
    if l.startswith("{"):
        o = json.loads(l); n += 1
        assert {"id", "method", "path", "route", "status", "outcome", "tokens_in", "tokens_out", "queue_ms", "inference_ms", "total_ms"} <= set(o), l
assert n >= 20, n' "$TMP/k1.log"
fi
check "the key is in no log line" bash -c "! grep -q '$KEY' '$TMP/k1.log'"
check "server starts (--api-key, --log-requests off)" start_server k2 "$POLLEN" serve "$S1" --api-key "$KEY" --log-requests off
check "--api-key: /tokenize without it -> 401" test "$(hcode -X POST "http://127.0.0.1:$PORT/tokenize" -d '{"inputs":"Hello"}')" = 401
check "--api-key: /tokenize with it -> 200" test "$(hcode -H "$AUTH" -X POST "http://127.0.0.1:$PORT/tokenize" -d '{"inputs":"Hello"}')" = 200
check "SIGTERM: exits 0 (--api-key)" stop_server
check "--log-requests off: no request line" bash -c "! grep -q 'request id=' '$TMP/k2.log'"
check_fails "--log-format yaml: refused" 'pollen: --log-format "yaml": expected text or json' "$POLLEN" serve "$S1" --log-format yaml --port 0
check_fails "--log-requests maybe: refused" 'pollen: --log-requests "maybe": expected on or off' "$POLLEN" serve "$S1" --log-requests maybe --port 0
check_fails "empty POLLEN_API_KEY: refused" 'POLLEN_API_KEY\) is empty' env POLLEN_API_KEY= "$POLLEN" serve "$S1" --port 0
check_fails "--host that does not resolve: refused naming it" 'serve: --host no-such-host.invalid: cannot resolve it' "$POLLEN" serve "$S1" --host no-such-host.invalid --port 0
if grep -q '^00000000000000000000000000000001 ' /proc/net/if_inet6 2>/dev/null; then
  check "server starts (--host ::1)" start_server v6 "$POLLEN" serve "$S1" --host ::1
  check "start-up line: http://[::1]:PORT" grep -q "on http://\[::1\]:$PORT " "$TMP/v6.log"
  check "/health over ::1" test "$($CURL -g -o /dev/null -w '%{http_code}' "http://[::1]:$PORT/health")" = 200
  check "SIGTERM: exits 0 (::1)" stop_server
else
  echo "SKIP: --host ::1 (no IPv6 loopback in /proc/net/if_inet6)"
fi

# ---- slow steps: disconnect, overload, drain ---------------------------------------------------
check "server starts (slow steps)" start_server b "$POLLEN" serve "$S1" --max-concurrent-requests 2 --step-delay-ms 20
TOTAL=$(metric pln_kv_blocks_total)
# the client goes away after three events (not after a time: on a loaded machine three may take long)
curl -s -N --max-time 60 -X POST "http://127.0.0.1:$PORT/generate_stream" -d '{"inputs":"x","parameters":{"max_new_tokens":500}}' >"$TMP/cut" 2>/dev/null &
CUT=$!
for _ in $(seq 1200); do [ "$(grep -c '^data:' "$TMP/cut")" -ge 3 ] && break; kill -0 $CUT 2>/dev/null || break; sleep 0.05; done
kill $CUT 2>/dev/null; wait $CUT 2>/dev/null
check "stream was cut mid-way" test "$(grep -c '^data:' "$TMP/cut")" -ge 3 -a "$(grep -c generated_text\":\" "$TMP/cut")" = 0
check "disconnected sequence left the batch" wait_metric pln_running_sequences 0 2
check "its KV blocks are free ($TOTAL)" wait_metric pln_kv_blocks_free "$TOTAL" 2
check "counted as cancelled" test "$(metric 'pln_sequences_finished_total{reason="cancelled"}')" = 1
pids=()
for i in 1 2; do post /generate_stream '{"inputs":"busy","parameters":{"max_new_tokens":200}}' >"$TMP/busy$i" & pids+=($!); done
check "two in flight" wait_metric pln_running_sequences 2 3
for i in 1 2 3; do
  c=$(code /generate '{"inputs":"extra"}')
  # answered while both busy streams still run: refused at once, not queued behind them
  check "extra request $i -> 429 while the two still run ($c)" test "$c" = 429 -a "$(metric pln_running_sequences)" = 2
done
check "429 body is TGI overloaded" grep -q '"error_type":"overloaded"' "$TMP/body"
kill -TERM "$RANK0"
check "draining: /health turns 503" bash -c 'for _ in $(seq 600); do [ "$('"$CURL"' -o /dev/null -w "%{http_code}" http://127.0.0.1:'"$PORT"'/health)" = 503 ] && exit 0; sleep 0.05; done; exit 1'
check "new request while draining -> 503" test "$(code /generate '{"inputs":"late"}')" = 503
wait "${pids[@]}"
check "in-flight streams ran to the end while draining" bash -c "grep -q 'generated_tokens\":200' $TMP/busy1 && grep -q 'generated_tokens\":200' $TMP/busy2"
check "SIGTERM: clean exit after draining" stop_server

# ---- fault injection ---------------------------------------------------------------------------
check "server starts (--fail-at-step 4)" start_server c "$POLLEN" serve "$S1" --fail-at-step 4
TOTAL=$(metric pln_kv_blocks_total)
EV=$(post /generate_stream '{"inputs":"x","parameters":{"max_new_tokens":20}}')
check "stream ends with an error event" grep -q '"error":".*injected.*","error_type":"generation"' <<<"$(grep '^data:' <<<"$EV" | tail -n 1)"
check "/health 503 after the failure" test "$($CURL -o "$TMP/body" -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 503
check "health says why" grep -q injected "$TMP/body"
check "KV memory freed" wait_metric pln_kv_blocks_free "$TOTAL" 2
check "new requests refused while unhealthy" test "$(code /generate '{"inputs":"x"}')" = 503
check "clean exit after a fault" stop_server

# ---- TP 2 under mpirun ------------------------------------------------------------------------
if command -v mpirun >/dev/null; then
  MPI="mpirun -np 2"
  check_fails "TP-2 set on one rank (--no-launch): clear error" "TP=2 but 1 rank" timeout 60 "$POLLEN" serve "$S2" --port 0 --no-launch
  check_fails "TP-1 set on two ranks: clear error" "TP=1 but 2 ranks" timeout 60 $MPI "$POLLEN" serve "$S1" --port 0
  check "server starts (TP 2, mpirun)" start_server d $MPI "$POLLEN" serve "$S2"
  check "/info reports tp 2" grep -q '"tp":2' <<<"$($CURL http://127.0.0.1:$PORT/info)"
  SRV_IDS=$(post /generate "$REQ" | sed 's/.*"tokens"://' | ids_of)
  T1=$(post /generate '{"inputs":"Hello world","parameters":{"max_new_tokens":16}}' | gen_text)
  T2=$(post /generate_stream '{"inputs":"Hello world","parameters":{"max_new_tokens":16}}' | grep '^data:' | tail -n 1 | gen_text)
  check "TP 2: stream == non-stream" test -n "$T1" -a "$T1" = "$T2"
  check "SIGTERM to rank 0: every rank exits 0" stop_server
  # stopped through the launcher, as an operator does (Ctrl-C, or kill on mpirun): a clean drain,
  # and nothing from Open MPI's event library (libevent's "[warn] Epoll MOD(...) ... Bad file
  # descriptor") on the way out. mpirun signals the ranks T s after it was signalled and kills
  # them T s later (odls_base_sigkill_timeout, default 1: docs/SERVING.md); a rank killed on its
  # way out makes that noise itself. T = 5 gives a rank under the sanitizers (LeakSanitizer's scan
  # at exit, a loaded machine) the time to finish, so what is checked is the drain's own output.
  for sig in TERM INT; do
    check "server starts (TP 2, stopped by SIG$sig to mpirun)" start_server m$sig $MPI --mca odls_base_sigkill_timeout 5 "$POLLEN" serve "$S2"
    post /generate '{"inputs":"Hello world","parameters":{"max_new_tokens":4}}' >/dev/null
    kill -$sig $SRV_PID
    for _ in $(seq 300); do kill -0 $SRV_PID 2>/dev/null || break; sleep 0.1; done
    wait $SRV_PID; rc=$?
    # (mpirun's own status is 1 after forwarding a signal, however its ranks ended; not killed)
    check "SIG$sig to mpirun: ended, not killed ($rc)" test $rc -lt 128
    check "SIG$sig to mpirun: drained" grep -q "drained, exiting" "$TMP/m$sig.log"
    check "SIG$sig to mpirun: no event-library noise" bash -c "! grep -Eiq 'epoll|libevent|\[warn\]|bad file descriptor' '$TMP/m$sig.log'"
  done
  check "server starts (TP 2, --fail-at-step 3)" start_server g $MPI "$POLLEN" serve "$S2" --fail-at-step 3
  EV=$(post /generate_stream '{"inputs":"x","parameters":{"max_new_tokens":20}}')
  check "TP 2: stream ends with an error event" grep -q '"error_type":"generation"' <<<"$(grep '^data:' <<<"$EV" | tail -n 1)"
  check "TP 2: /health 503 after the failure" test "$($CURL -o /dev/null -w '%{http_code}' http://127.0.0.1:$PORT/health)" = 503
  check "TP 2: every rank exits 0 after a fault" stop_server
  GEN_IDS=$($MPI "$POLLEN" generate "$S2" --prompt "Hello world" --max-new-tokens 12 --temperature 0 --json --quiet 2>/dev/null |
            sed -n 's/.*"ids":\[\([0-9,]*\)\].*/\1/p'),
  check "TP 2 server tokens == TP 2 pollen generate" test -n "$GEN_IDS" -a "$SRV_IDS" = "$GEN_IDS"
  # The same model at TP 1 and TP 2 (needs `pollen reshard` and the fixture checkpoint).
  SRC=tests/fixtures/models/bloom-4h/fp16-st
  if [ -d "$SRC" ] && "$POLLEN" reshard --help >/dev/null 2>&1; then
    check "reshard TP 1" "$POLLEN" reshard "$SRC" -o "$TMP/r1" --tp 1 --dtype fp16 --quiet
    check "reshard TP 2" "$POLLEN" reshard "$SRC" -o "$TMP/r2" --tp 2 --dtype fp16 --quiet
    # prompt scoring and alternatives too: every log-prob (prefill, tokens, top_tokens) in order
    SCORE='{"inputs":"Hello world, this is a test","parameters":{"max_new_tokens":4,"details":true,"decoder_input_details":true,"top_n_tokens":3}}'
    lps() { grep -o '"logprob":[-0-9.e]*' | sed 's/"logprob"://' | tr '\n' ' '; }
    check "server starts (resharded TP 1)" start_server e "$POLLEN" serve "$TMP/r1"
    A1=$(post /generate "$REQ" | sed 's/.*"tokens"://' | ids_of); L1=$(post / "$SCORE" | lps); stop_server
    check "server starts (resharded TP 2)" start_server f $MPI "$POLLEN" serve "$TMP/r2"
    A2=$(post /generate "$REQ" | sed 's/.*"tokens"://' | ids_of); L2=$(post / "$SCORE" | lps); stop_server
    check "a TP-2 server answers like a TP-1 server ($A1)" test -n "$A1" -a "$A1" = "$A2"
    check "TP 2 prompt log-probs and alternatives == TP 1 (within 1e-3)" awk -v a="$L1" -v b="$L2" 'BEGIN {
      n = split(a, x, " "); m = split(b, y, " "); if (n != m || n < 20) exit 1
      for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-3) exit 1 } }'
  else
    echo "SKIP: TP-1 vs TP-2 of one model (pollen reshard or the fixture is missing)"
  fi
else
  echo "SKIP: mpirun not installed"
fi

# ---- SIGHUP drains as SIGTERM does (a closed terminal must not drop requests in flight) ----------
check "server starts (SIGHUP)" start_server h "$POLLEN" serve "$S1" --step-delay-ms 20
post /generate_stream '{"inputs":"busy","parameters":{"max_new_tokens":60}}' >"$TMP/hup" &
HUP_CLIENT=$!
check "SIGHUP: the request is in flight" wait_metric pln_running_sequences 1 30
kill -HUP "$RANK0"
wait $HUP_CLIENT
check "SIGHUP: the request in flight ran to its end" grep -q 'generated_tokens":60' "$TMP/hup"
check "SIGHUP: the server exits 0 after draining" bash -c "for _ in \$(seq 600); do kill -0 $SRV_PID 2>/dev/null || exit 0; sleep 0.1; done; exit 1"
wait $SRV_PID; HUP_RC=$?
check "SIGHUP: exit status 0 ($HUP_RC)" test "$HUP_RC" = 0
check "SIGHUP: the log says it drained" grep -q "SIGHUP: draining" "$TMP/h.log"
# ---- the set's own chat template (tokenizer_config.json), --chat-template FILE.jinja, model names --
S3=$TMP/s3
cp -r "$S1" "$S3"
cat >"$S3/tokenizer_config.json" <<'J'
{"bos_token": "<s>", "eos_token": "</s>",
 "chat_template": "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('Tool messages are not supported') }}{% endif %}{{ m.role | upper }}: {{ m.content | trim }}\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"}
J
printf '[{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hello world"}]' >"$TMP/msgs.json"
PROMPT=$("$POLLEN" template "$S3" --messages "$TMP/msgs.json" | sed -z 's/\n/\\n/g')
check "pollen template renders the set's template" test "$PROMPT" = 'SYSTEM: Be brief.\nUSER: Hello world\nASSISTANT:'
check "server starts with the set's own chat template" start_server j "$POLLEN" serve "$S3" --served-model-name s3-chat,org/alias
check "start-up names the template" grep -q "chat template: .*tokenizer_config.json (chat_template)" "$TMP/j.log"
CHAT='{"model":"dummy","messages":[{"role":"system","content":" Be brief. "},{"role":"user","content":"Hello world"}],"max_tokens":8,"temperature":0}'
CH=$(post /v1/chat/completions "$CHAT" | sed -n 's/.*"content":"\(.*\)"},"logprobs.*/\1/p')
CO=$(post /v1/completions "{\"model\":\"s3-chat\",\"prompt\":\"$PROMPT\",\"max_tokens\":8,\"temperature\":0}" | sed -n 's/.*"text":"\(.*\)","index.*/\1/p')
check "chat (model \"dummy\") == completion of the rendered prompt ('$CH' vs '$CO')" test -n "$CO" -a "$CH" = "$CO"
check "raise_exception: 400 with the template's message" \
  grep -q '"code":"chat_template_error"' <<<"$(post /v1/chat/completions '{"messages":[{"role":"tool","content":"x"}]}')"
check "its message is the template's" grep -q 'Tool messages are not supported' <<<"$(post /v1/chat/completions '{"messages":[{"role":"tool","content":"x"}]}')"
check "/v1/models lists the served names" grep -q '"id":"s3-chat".*"id":"org/alias"' <<<"$($CURL http://127.0.0.1:$PORT/v1/models)"
check "GET /v1/models/org/alias" grep -q '"id":"org/alias","object":"model"' <<<"$($CURL http://127.0.0.1:$PORT/v1/models/org/alias)"
check "an unknown model: 404" test "$(code /v1/chat/completions '{"model":"nope","messages":[{"role":"user","content":"x"}]}')" = 404
check "SIGTERM: exits 0 (chat template)" stop_server
printf '%s' '{{ "<<" + messages[-1].content + ">>" }}' >"$TMP/over.jinja"
check "server starts with --chat-template FILE.jinja" start_server k "$POLLEN" serve "$S3" --chat-template "$TMP/over.jinja"
CH=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"Hello world"}],"max_tokens":6,"temperature":0}' | sed -n 's/.*"content":"\(.*\)"},"logprobs.*/\1/p')
CO=$(post /v1/completions '{"prompt":"<<Hello world>>","max_tokens":6,"temperature":0}' | sed -n 's/.*"text":"\(.*\)","index.*/\1/p')
check "--chat-template overrides the set's ('$CH' vs '$CO')" test -n "$CO" -a "$CH" = "$CO"
check "SIGTERM: exits 0 (override)" stop_server
printf 'ok\n{%% for m in messages %%}{{ m | frobnicate }}{%% endfor %%}\n{%% include "other.jinja" %%}' >"$TMP/bad.jinja"
check_fails "a template pollen cannot parse fails at start-up, naming line and construct" "bad.jinja:3: the \{% include %\} tag is not supported" \
  "$POLLEN" serve "$S3" --chat-template "$TMP/bad.jinja" --port 0

e2e_done
