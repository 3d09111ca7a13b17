#!/usr/bin/env bash
# e2e_ranks.sh — a rank group on one host when ranks idle, stall or die, under `mpirun -np 2`:
# an idle rank's waits use under 5 % of a core (about 1 % when quiet; a spinning wait is 100 %)
# and wake within a few ms (test_comm --idle; and the
# serve worker's CPU time from /proc while no request runs); a collective that a rank never joins
# fails at its bound naming that rank (test_comm --stall, 2 and 3 ranks); `serve` with a worker
# stopped by SIGSTOP fails the request in flight naming rank 1, turns /health 503, and every rank
# exits non-zero within the bound; a worker killed by SIGKILL ends the job with rank 0 naming it;
# a step that never returns (simulated by a 9 s test delay, TP 1) ends serve with exit 3 after twice
# its bound plus 5 s.
# Every wait is bounded; servers use --port 0 --port-file.
source "$(dirname "$0")/e2e.sh"
HELPER=${PLN_BUILD:-build}/tests/test_shard
COMM=${PLN_BUILD:-build}/tests/test_comm
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; e2e_done; exit; }
command -v curl >/dev/null || { echo "SKIP: curl not installed (make deps)"; e2e_done; exit; }
[ -x "$HELPER" ] && [ -x "$COMM" ] || { echo "SKIP: $HELPER or $COMM not built"; e2e_done; exit; }
export OMP_NUM_THREADS=1
CURL="curl -s --max-time 30"

# ---- waiting: CPU and wake-up latency, the bound ------------------------------------------------
out=$(timeout 60 mpirun -np 2 "$COMM" --idle 3 2>&1); echo "$out" | grep -v '^\['
check "idle rank: under 5 % of a core (about 1 % on a quiet machine; a spinning wait is 100 %), every broadcast arrives" grep -q 'test_comm_idle: [1-9][0-9]* passed, 0 failed' <<<"$out"
for np in 2 3; do
  t0=$(date +%s%N)
  out=$(timeout 60 mpirun -np $np "$COMM" --stall 2>&1); rc=$?
  dt=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "$out" | grep -E '^stall:|stopped answering' | head -n 3
  check "np $np: a rank that never joins: the all-reduce fails at its bound naming rank $((np - 1))" \
    grep -q 'test_comm_stall: [1-9][0-9]* passed, 0 failed' <<<"$out"
  check "np $np: the job is aborted (exit $rc, after ${dt} ms; 124: still running at the 60 s hang guard)" test $rc -ne 0 -a $rc -ne 124
done

# ---- serve: idle CPU, first request after idling -----------------------------------------------
S2=$TMP/s2
check "sample TP-2 set" "$HELPER" --write-sample "$S2" --tp 2
# start_server NAME ARGS...: `mpirun -np 2 pollen serve` in the background; sets PORT, SRV_PID,
# RANK0 and RANK1 (pids, from --show-placement). Fails after 30 s.
start_server() {
  local name=$1; shift
  rm -f "$TMP/$name.port"
  timeout -k 5 120 mpirun -np 2 "$POLLEN" serve "$S2" --port 0 --port-file "$TMP/$name.port" --quiet --show-placement "$@" \
    >"$TMP/$name.log" 2>&1 &
  SRV_PID=$!
  for _ in $(seq 300); do [ -s "$TMP/$name.port" ] && break; kill -0 $SRV_PID 2>/dev/null || break; sleep 0.1; done
  PORT=$(cat "$TMP/$name.port" 2>/dev/null)
  RANK0=$(sed -n 's/.*placement: rank 0 of 2 (pid \([0-9]*\)).*/\1/p' "$TMP/$name.log")
  RANK1=$(sed -n 's/.*placement: rank 1 of 2 (pid \([0-9]*\)).*/\1/p' "$TMP/$name.log")
  [ -n "$PORT" ] && [ -n "$RANK0" ] && [ -n "$RANK1" ]
}
alive() { [ -e /proc/$1 ] && ! grep -q '^[^)]*) [ZX]' /proc/$1/stat 2>/dev/null; }
# wait_exit SECONDS: waits for the launcher; sets RC (999 when it had to be killed) and LEFT (ranks
# still running 5 s after it, which are then killed: a stopped one is ours to end).
wait_exit() {
  for _ in $(seq $(( $1 * 10 ))); do kill -0 $SRV_PID 2>/dev/null || break; sleep 0.1; done
  if kill -0 $SRV_PID 2>/dev/null; then kill -KILL $SRV_PID; RC=999; else wait $SRV_PID; RC=$?; fi
  LEFT=""
  for _ in $(seq 50); do alive $RANK0 || alive $RANK1 || break; sleep 0.1; done
  for p in $RANK0 $RANK1; do alive "$p" && { LEFT="$LEFT $p"; kill -KILL "$p"; }; done
  return 0
}
cpu_ns() { # CPU time of every thread of a process, in ns (schedstat: exact, not in clock ticks)
  local sum=0 f
  for f in /proc/$1/task/*/schedstat; do sum=$((sum + $(cut -d' ' -f1 "$f" 2>/dev/null || echo 0))); done
  echo $sum
}
post() { $CURL -X POST -H 'Content-Type: application/json' "http://127.0.0.1:$PORT$1" -d "$2"; }

check "server starts (TP 2)" start_server idle
WARM=$(post /generate '{"inputs":"Hello world","parameters":{"max_new_tokens":4}}')
sleep 1
# The yardstick: what a spinning process gets of a core over the same 4 s (all of one on a quiet
# machine, its fair share on a loaded one, where each of the worker's wake-ups also costs more).
( while :; do :; done ) & SPIN=$!
a=$(cpu_ns $RANK1); sa=$(cpu_ns $SPIN); t0=$(date +%s%N); sleep 4; b=$(cpu_ns $RANK1); sb=$(cpu_ns $SPIN); t1=$(date +%s%N)
kill $SPIN; wait $SPIN 2>/dev/null
pct=$(awk -v c=$((b - a)) -v t=$((t1 - t0)) 'BEGIN{printf "%.2f", 100 * c / t}')
spun=$(awk -v c=$((sb - sa)) -v t=$((t1 - t0)) 'BEGIN{printf "%.2f", 100 * c / t}')
echo "idle serve: rank 1 used $pct % of a core over 4 s; a spinning process got $spun %"
check "idle serve worker: $pct % of a core (limit: 5 %, or a third of a spinner's $spun %)" \
  awk -v p="$pct" -v s="$spun" 'BEGIN{exit !(p < 5.0 || p < s / 3)}'
t0=$(date +%s%N); AFTER=$(post /generate '{"inputs":"Hello world","parameters":{"max_new_tokens":4}}'); t1=$(date +%s%N)
echo "first request after 5 s idle: $(( (t1 - t0) / 1000000 )) ms"
check "the first request after idling answers as before ($AFTER)" test -n "$WARM" -a "$AFTER" = "$WARM"
kill -TERM "$RANK0"; wait_exit 20
check "SIGTERM: clean exit ($RC)" test "$RC" = 0

# ---- step watchdog: a stopped worker ----------------------------------------------------------
check "server starts (--step-timeout 2)" start_server stop --step-timeout 2
kill -STOP "$RANK1"
t0=$(date +%s%N)
post /generate '{"inputs":"Hello","parameters":{"max_new_tokens":50}}' >"$TMP/stop.body" &
REQ=$!
seen=""
for _ in $(seq 150); do
  c=$($CURL --max-time 1 -o "$TMP/health" -w '%{http_code}' "http://127.0.0.1:$PORT/health")
  [ "$c" = 503 ] && { seen=$c; cp "$TMP/health" "$TMP/health503"; break; }
  kill -0 $SRV_PID 2>/dev/null || break
  sleep 0.05
done
wait $REQ
wait_exit 20
dt=$(( ($(date +%s%N) - t0) / 1000000 ))
check "the request in flight gets an error naming rank 1" grep -q '"error":".*rank 1 stopped answering.*","error_type":"generation"' "$TMP/stop.body"
check "/health turned 503" test "$seen" = 503
check "/health says which rank" grep -q 'rank 1 stopped answering' "$TMP/health503"
check "every rank exits non-zero (exit $RC after ${dt} ms; 999: killed at the 20 s hang guard)" test "$RC" != 0 -a "$RC" != 999
check "rank 0 names the rank" grep -q 'pollen serve: rank 1 stopped answering: it never reached collective' "$TMP/stop.log"
check "no rank is left behind ($LEFT)" test -z "$LEFT"

# ---- a worker killed in the middle of a request ---------------------------------------------------
check "server starts (slow steps)" start_server kill --step-delay-ms 20
$CURL -N -X POST "http://127.0.0.1:$PORT/generate_stream" -d '{"inputs":"Hello","parameters":{"max_new_tokens":500}}' \
  >"$TMP/kill.body" &
REQ=$!
for _ in $(seq 100); do [ "$(grep -c '^data:' "$TMP/kill.body")" -ge 3 ] && break; sleep 0.05; done
t0=$(date +%s%N)
kill -KILL "$RANK1"
wait $REQ
wait_exit 20
dt=$(( ($(date +%s%N) - t0) / 1000000 ))
check "the job ends non-zero (exit $RC after ${dt} ms; 999: killed at the 20 s hang guard)" test "$RC" != 0 -a "$RC" != 999
check "the stream ends with an error naming rank 1" grep -q '"error":".*rank 1 (pid [0-9]*) is gone' "$TMP/kill.body"
check "rank 0 says which rank is gone" grep -q 'pollen serve: rank 1 (pid [0-9]*) is gone' "$TMP/kill.log"
# ---- a step that never returns (what a hung device collective looks like to the host) -----------
S1=$TMP/s1
check "sample TP-1 set" "$HELPER" --write-sample "$S1" --tp 1
rm -f "$TMP/hang.port"
timeout -k 5 60 "$POLLEN" serve "$S1" --port 0 --port-file "$TMP/hang.port" --quiet --step-timeout 1 --step-delay-ms 9000 \
  >"$TMP/hang.log" 2>&1 &
SRV_PID=$!; RANK0=$SRV_PID; RANK1=$SRV_PID
for _ in $(seq 300); do [ -s "$TMP/hang.port" ] && break; kill -0 $SRV_PID 2>/dev/null || break; sleep 0.1; done
PORT=$(cat "$TMP/hang.port" 2>/dev/null)
t0=$(date +%s%N)
post /generate '{"inputs":"Hi","parameters":{"max_new_tokens":2}}' >/dev/null &
REQ=$!
seen=""
for _ in $(seq 200); do
  c=$($CURL --max-time 1 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")
  [ "$c" = 503 ] && { seen=$c; break; }
  kill -0 $SRV_PID 2>/dev/null || break
  sleep 0.05
done
wait $REQ
wait_exit 20
dt=$(( ($(date +%s%N) - t0) / 1000000 ))
# not before 2 x 1 s + 5 s (the rule); how long after is the machine's (20 s: the hang guard)
check "a step stuck past 2 x 1 s + 5 s: exit 3 ($RC), not before 7 s (${dt} ms)" test "$RC" = 3 -a $dt -ge 7000
check "... with /health 503 before it" test "$seen" = 503
check "... and a message saying so" grep -q 'pollen serve: a step has run 7.*s, past twice its bound (1 s, --step-timeout) plus 5 s' "$TMP/hang.log"
e2e_done
