#!/usr/bin/env bash
# e2e_signals.sh — SIGTERM and SIGINT stop every command promptly at any phase: `serve` and
# `generate` while they load (TP 1, and TP 2 under mpirun), with a message and a non-zero exit
# within a few seconds; `reshard` and `synth` mid-write leave neither the output nor a temporary
# sibling, and an earlier output they were replacing stays whole. PLN_TEST_LOAD_DELAY_MS holds a
# load with the rank file open; PLN_FAULT_DELAY_MS slows every write (a slow disk).
source "$(dirname "$0")/e2e.sh"
HELPER=${PLN_BUILD:-build}/tests/test_shard
[ -x "$HELPER" ] || { echo "SKIP: $HELPER not built"; e2e_done; exit; }
FIX=tests/fixtures/models/bloom-4h/fp16-st
S1=$TMP/s1; S2=$TMP/s2
check "sample TP-1 set" "$HELPER" --write-sample "$S1" --tp 1
check "sample TP-2 set" "$HELPER" --write-sample "$S2" --tp 2

wait_line() { # FILE REGEX SECONDS
  for _ in $(seq $(( $3 * 10 ))); do grep -Eq "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "no \"$2\" in $1 after $3 s" >&2; return 1
}
wait_exit() { # PID SECONDS: RC = its status; 999 when it had to be killed
  for _ in $(seq $(( $2 * 10 ))); do kill -0 "$1" 2>/dev/null || { wait "$1"; RC=$?; return 0; }; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null; wait "$1" 2>/dev/null; RC=999; return 1
}
no_leftovers() { [ ! -e "$1" ] && [ -z "$(ls -d "$1".tmp-* "$1".old-* 2>/dev/null)" ]; }

# signal_during_load LABEL SIG WHO LAUNCH...: starts LAUNCH with a 60 s load pause, sends SIG to
# WHO (launcher, or rank0 = the pid rank 0 prints) once the pause began; the process must be gone
# within 5 s. Leaves RC and $TMP/load.err.
signal_during_load() {
  local label=$1 sig=$2 who=$3; shift 3
  PLN_TEST_LOAD_DELAY_MS=60000 "$@" >"$TMP/load.out" 2>"$TMP/load.err" &
  local pid=$!
  wait_line "$TMP/load.err" "rank 0 \(pid [0-9]+\) pausing" 30
  local target=$pid
  [ "$who" = rank0 ] && target=$(sed -n 's/.*rank 0 (pid \([0-9]*\)) pausing.*/\1/p' "$TMP/load.err")
  kill -$sig "$target"
  wait_exit $pid 5
  check "$label: $sig during load ends it within 5 s (exit $RC)" test "$RC" != 999 -a "$RC" != 0
}

# ---- serve and generate, TP 1 ----
signal_during_load "serve TP 1" TERM launcher "$POLLEN" serve "$S1" --port 0 --quiet
check "serve TP 1: says why" grep -q "SIGTERM during start-up: exiting" "$TMP/load.err"
check "serve TP 1: exit status 143 (got $RC)" test "$RC" = 143
signal_during_load "serve TP 1" INT launcher "$POLLEN" serve "$S1" --port 0 --quiet
check "serve TP 1: says why" grep -q "SIGINT during start-up: exiting" "$TMP/load.err"
signal_during_load "generate TP 1" INT launcher "$POLLEN" generate "$S1" --prompt hi --quiet
check "generate TP 1: says why" grep -q "pollen generate: interrupted by SIGINT" "$TMP/load.err"
signal_during_load "generate TP 1" TERM launcher "$POLLEN" generate "$S1" --prompt hi --quiet
check "generate TP 1: says why" grep -q "pollen generate: interrupted by SIGTERM" "$TMP/load.err"
signal_during_load "bench TP 1" TERM launcher "$POLLEN" bench "$S1" --prompt-len 4 --batch 1 --steps 1 --context 2 --stream-mib 8
check "bench TP 1: says why" grep -q "pollen bench: interrupted by SIGTERM" "$TMP/load.err"

# ---- TP 2 under mpirun: to mpirun (it forwards), and to rank 0 alone ----
if command -v mpirun >/dev/null; then
  signal_during_load "serve TP 2, to mpirun" TERM launcher mpirun -np 2 "$POLLEN" serve "$S2" --port 0 --quiet
  check "serve TP 2, to mpirun: says why" grep -q "SIGTERM during start-up" "$TMP/load.err"
  signal_during_load "serve TP 2, to rank 0" TERM rank0 mpirun -np 2 "$POLLEN" serve "$S2" --port 0 --quiet
  check "serve TP 2, to rank 0: says why" grep -q "SIGTERM during start-up" "$TMP/load.err"
  signal_during_load "generate TP 2, to mpirun" INT launcher mpirun -np 2 "$POLLEN" generate "$S2" --prompt hi --quiet
  signal_during_load "generate TP 2, to rank 0" TERM rank0 mpirun -np 2 "$POLLEN" generate "$S2" --prompt hi --quiet
  check "generate TP 2, to rank 0: says why" grep -q "interrupted by SIGTERM" "$TMP/load.err"
else
  echo "SKIP: TP 2: mpirun not installed"
fi

# ---- reshard and synth mid-write: nothing at the final path, no temporary sibling ----
# interrupt_write LABEL SIG OUT LAUNCH...: signals LAUNCH once its temporary output exists.
interrupt_write() {
  local label=$1 sig=$2 out=$3; shift 3
  PLN_FAULT_DELAY_MS=100 "$@" >"$TMP/w.out" 2>"$TMP/w.err" &
  local pid=$!
  for _ in $(seq 100); do ls -d "$out".tmp-* >/dev/null 2>&1 && break; sleep 0.05; done
  sleep 0.3
  check "$label: temporary output exists mid-way" bash -c "ls -d '$out'.tmp-* >/dev/null 2>&1"
  kill -$sig $pid
  wait_exit $pid 10
  check "$label: $sig ends it within 10 s (exit $RC)" test "$RC" != 999 -a "$RC" != 0
  check "$label: says why" grep -q "interrupted by SIG$sig; removing the temporary output" "$TMP/w.err"
}
for sig in TERM INT HUP; do
  interrupt_write "reshard" $sig "$TMP/rs" "$POLLEN" reshard $FIX -o "$TMP/rs" --tp 2 --dtype int8 --quiet
  check "reshard, SIG$sig: no output and no temporary sibling" no_leftovers "$TMP/rs"
  interrupt_write "synth" $sig "$TMP/sy" "$POLLEN" synth --model $FIX/config.json -o "$TMP/sy" --quiet
  check "synth, SIG$sig: no output and no temporary sibling" no_leftovers "$TMP/sy"
done
# replacing an earlier set with --force, interrupted: the earlier set stays whole
check "an earlier set" "$POLLEN" reshard $FIX -o "$TMP/old" --tp 1 --dtype fp16 --quiet
sum() { (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum; }
before=$(sum "$TMP/old")
interrupt_write "reshard --force over a set" TERM "$TMP/old" "$POLLEN" reshard $FIX -o "$TMP/old" --tp 2 --dtype int8 --quiet --force
check "the earlier set is untouched" test "$(sum "$TMP/old")" = "$before"
check "no temporary sibling" test -z "$(ls -d "$TMP/old".tmp-* "$TMP/old".old-* 2>/dev/null)"
check "the earlier set still verifies" "$POLLEN" verify "$TMP/old" --source $FIX
e2e_done
