#!/usr/bin/env bash
# e2e_http_hostile.sh — `pollen serve` (the real process, real tokenizer) against hostile
# clients on 127.0.0.1, for what needs the whole process: SIGTERM with an idle keep-alive
# connection or a half-sent request exits at once, with a request in flight it exits once that
# request is answered; /tokenize of a ~1 MB body (8 at once) is refused by --max-input-tokens and
# the server's peak memory stays small; --max-connections-per-client refuses a client's surplus
# connections while another address is served, and --request-timeout frees them.
# The framing and slow-client classes in detail: tests/test_http_hostile.c.
# Ports are chosen by the kernel (--port 0 --port-file); every wait is for a state the server
# reports in /metrics, bounded only as a hang guard; nothing assumes how fast the machine is.
source "$(dirname "$0")/e2e.sh"
HELPER=${PLN_BUILD:-build}/tests/test_shard
command -v curl >/dev/null || { echo "SKIP: curl not installed (make deps)"; e2e_done; exit; }
[ -x "$HELPER" ] || { echo "SKIP: $HELPER not built"; e2e_done; exit; }
CURL="curl -s --max-time 30"

# wait_metric NAME VALUE: waits (bounded, 30 s: a hang guard) until /metrics says NAME is VALUE:
# the state a step needs, reported by the server, never a sleep.
wait_metric() {
  for _ in $(seq 600); do [ "$(metric "$1")" = "$2" ] && return 0; kill -0 $SRV_PID 2>/dev/null || break; sleep 0.05; done
  echo "metric $1 = $(metric "$1"), want $2" >&2; return 1
}
# exits_within SECONDS: the server (already signalled) exits 0 within SECONDS (a hang guard); else
# it is killed.
exits_within() {
  local t0=$(date +%s.%N)
  for _ in $(seq $(( $1 * 20 ))); do kill -0 $SRV_PID 2>/dev/null || break; sleep 0.05; done
  if kill -0 $SRV_PID 2>/dev/null; then kill -KILL $SRV_PID; wait $SRV_PID 2>/dev/null; echo "still running after $1 s" >&2; return 1; fi
  wait $SRV_PID; local rc=$?
  echo "exited $rc after $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}') s" >&2
  [ $rc = 0 ]
}
hwm_kb() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' /proc/$SRV_PID/status; }
status_of() { # curl args... : the HTTP status ("000" when refused)
  $CURL -o "$TMP/body" -w '%{http_code}' "$@"
}

S1=$TMP/s1
check "sample TP-1 set" "$HELPER" --write-sample "$S1" --tp 1

# ---- SIGTERM: an idle keep-alive connection and a half-sent request hold nothing up ------------
check "server starts" start_server a "$POLLEN" serve "$S1"
exec 3<>/dev/tcp/127.0.0.1/$PORT
printf 'GET /health HTTP/1.1\r\nHost: t\r\n\r\n' >&3
read -r -t 5 LINE <&3
check "keep-alive request answered ($LINE)" grep -q '^HTTP/1.1 200' <<<"$LINE"
exec 4<>/dev/tcp/127.0.0.1/$PORT
printf 'POST /generate HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{"inputs"' >&4
# the server holds both: the keep-alive, the half-sent request (its head arrived) and the scrape
check "the server has the half-sent request's head" wait_metric pln_open_connections 2
check "and both connections" wait_metric pln_client_connections 3
kill -TERM $SRV_PID
# the grace is 30 s: ending before it shows neither connection was waited for
check "SIGTERM with an idle keep-alive and a half-sent request: exit 0 before the 30 s grace" exits_within 25
exec 3>&- 4>&-

# ---- SIGTERM: a request in flight is answered, then the server exits ---------------------------
check "server starts (--step-delay-ms 40)" start_server b "$POLLEN" serve "$S1" --step-delay-ms 40
exec 3<>/dev/tcp/127.0.0.1/$PORT
printf 'GET /health HTTP/1.1\r\nHost: t\r\n\r\n' >&3
read -r -t 5 LINE <&3
$CURL -o "$TMP/inflight" -w '%{http_code}' -X POST "http://127.0.0.1:$PORT/generate" \
  -d '{"inputs":"Hello","parameters":{"max_new_tokens":30,"details":true}}' >"$TMP/inflight.code" &
CURL_PID=$!
check "the request is in flight" wait_metric pln_running_sequences 1
kill -TERM $SRV_PID
check "with a request in flight: exit 0 once it is answered" exits_within 60
wait $CURL_PID
check "the request in flight was answered in full" \
  bash -c "test \"\$(cat $TMP/inflight.code)\" = 200 && grep -q '\"generated_tokens\":30' $TMP/inflight"
exec 3>&-

# ---- /tokenize: a ~1 MB body cannot make a huge reply or a huge server ------------------------
check "server starts" start_server c "$POLLEN" serve "$S1" --max-connections-per-client 6 --request-timeout 2
python3 -c "import json; print(json.dumps({'inputs': 'hello world, the quick brown fox ' * 29000}))" >"$TMP/big.json"
H0=$(hwm_kb)
check "/tokenize of ~1 MB: 422" test "$(status_of -X POST --data-binary @"$TMP/big.json" "http://127.0.0.1:$PORT/tokenize")" = 422
check "the refusal names --max-input-tokens, TGI shape" grep -q '"error":".*--max-input-tokens.*","error_type":"validation"' "$TMP/body"
check "the refusal is small ($(wc -c <"$TMP/body") bytes)" test "$(wc -c <"$TMP/body")" -lt 1024
pids=()
for i in 1 2 3 4; do status_of -X POST --data-binary @"$TMP/big.json" "http://127.0.0.1:$PORT/tokenize" >"$TMP/t$i" & pids+=($!); done
wait "${pids[@]}"
ALL4=$(cat "$TMP/t1" "$TMP/t2" "$TMP/t3" "$TMP/t4")
check "4 at once: each 422 ($ALL4)" test "$ALL4" = 422422422422
H1=$(hwm_kb)
check "peak server memory grew by $(( (H1 - H0) / 1024 )) MB (< 200 MB; was ~600 MB per request)" test $(( H1 - H0 )) -lt 204800
check "a small /tokenize still works" grep -q '"text":"Hello"' <<<"$($CURL -X POST "http://127.0.0.1:$PORT/tokenize" -d '{"inputs":"Hello"}')"
head -c $(( 2 * 1024 * 1024 )) /dev/zero | tr '\0' ' ' >"$TMP/huge"
check "a 2 MB body: 413" test "$(status_of -X POST --data-binary @"$TMP/huge" "http://127.0.0.1:$PORT/tokenize")" = 413
check "a 2 MB chunked body: 413" \
  test "$(status_of -X POST -H 'Transfer-Encoding: chunked' --data-binary @"$TMP/huge" "http://127.0.0.1:$PORT/tokenize")" = 413
# a chunk extension of 40 KB (past libmicrohttpd's buffer, which alone answered 500): the relay's 413
exec 9<>/dev/tcp/127.0.0.1/$PORT
{ printf 'POST /tokenize HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5;'; head -c 40000 /dev/zero | tr '\0' e
  printf '\r\n{"inp\r\n0\r\n\r\n'; } >&9 2>/dev/null
read -r -t 30 LINE <&9
exec 9>&-
check "a 40 KB chunk extension: 413 ($LINE)" grep -q '^HTTP/1.1 413' <<<"$LINE"
check "and the server still serves" test "$(status_of "http://127.0.0.1:$PORT/health")" = 200

# ---- per-client limit and request deadline on the real server ---------------------------------
check "/info shows the limits" grep -q '"request_timeout_s":2,"max_connections_per_client":6' <<<"$($CURL http://127.0.0.1:$PORT/info)"
# scrapes from now on come from another address: 127.0.0.1 is to hold exactly its six
metric() { $CURL --interface 127.0.0.2 "http://127.0.0.1:$PORT/metrics" | sed -n "s/^$1 //p"; }
# (libmicrohttpd's own count: a connection leaves it only once its place under the per-client
# limit is free again)
check "the connections above are gone" wait_metric pln_client_connections 1
for fd in 3 4 5 6 7 8; do eval "exec $fd<>/dev/tcp/127.0.0.1/$PORT"; printf 'GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: a' >&$fd; done
check "the six dribbling connections are accepted" wait_metric pln_client_connections 7
check "a seventh connection from 127.0.0.1 is refused" test "$(status_of "http://127.0.0.1:$PORT/health")" = 000
check "another address is served meanwhile" test "$(status_of --interface 127.0.0.2 "http://127.0.0.1:$PORT/health")" = 200
read -r -t 5 LINE <&3
check "the dribbling connections get 408 from the deadline ($LINE)" grep -q '^HTTP/1.1 408' <<<"$LINE"
check "and are closed" wait_metric pln_client_connections 1
check "then 127.0.0.1 is served again" test "$(status_of "http://127.0.0.1:$PORT/health")" = 200
exec 3>&- 4>&- 5>&- 6>&- 7>&- 8>&-
check "pln_request_timeouts_total counts them" grep -qx 'pln_request_timeouts_total 6' <<<"$($CURL http://127.0.0.1:$PORT/metrics)"
kill -TERM $SRV_PID
check "clean exit" exits_within 30
e2e_done
