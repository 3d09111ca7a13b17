#!/usr/bin/env bash
# e2e_signals.sh — SIGTERM and SIGINT stop every command promptly at any phase: `serve` and
# `generate` while they load (TP 1, and TP 2 under mpirun), with a message and a non-zero exit
# within a few seconds; `reshard` and `synth` mid-write, stopped by any terminating signal
# (TERM INT HUP QUIT PIPE USR1 USR2 ALRM XCPU VTALRM PROF), leave neither the output nor a
# temporary sibling, SIGXFSZ is ignored (a write over the size limit fails and cleans up), a
# sibling left by a killed run is removed by the next one (and only such a sibling), and an
# earlier output they were replacing stays whole. PLN_TEST_LOAD_DELAY_MS holds a
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

# signal_during_load LABEL SIG WHO LAUNCH...: starts LAUNCH with a 120 s load pause, sends SIG to
# WHO (launcher, or rank0 = the pid rank 0 prints) once the pause began; the process must be gone
# long before the pause would end (60 s: a hang guard, not a speed). Leaves RC and $TMP/load.err.
signal_during_load() {
  local label=$1 sig=$2 who=$3; shift 3
  # The previous case's log must go first: the child truncates it only once it runs, and a stale
  # "pausing" line would send the signal before the child is even a pollen process (a background
  # job of a script starts with SIGINT ignored, so that signal would be lost).
  rm -f "$TMP/load.out" "$TMP/load.err"
  PLN_TEST_LOAD_DELAY_MS=120000 env --default-signal "$@" >"$TMP/load.out" 2>"$TMP/load.err" &
  local pid=$!
  wait_line "$TMP/load.err" "rank 0 \(pid [0-9]+\) pausing" 30
  local target=$pid
  [ "$who" = rank0 ] && target=$(sed -n 's/.*rank 0 (pid \([0-9]*\)) pausing.*/\1/p' "$TMP/load.err")
  kill -$sig "$target"
  wait_exit $pid 60
  check "$label: $sig during load ends it, not the pause (exit $RC)" test "$RC" != 999 -a "$RC" != 0
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
# wait_writing OUT PID: waits (bounded, 30 s) until OUT's temporary sibling holds a file besides
# its marker, i.e. the command is mid-write (PLN_FAULT_DELAY_MS keeps it there).
wait_writing() {
  for _ in $(seq 600); do
    ls -A "$1".tmp-* 2>/dev/null | grep -qv -e '^\.pollen-tmp$' -e '^$' -e ':$' && return 0
    kill -0 "$2" 2>/dev/null || break; sleep 0.05
  done
  return 1
}
# interrupt_write LABEL SIG OUT LAUNCH...: signals LAUNCH once it is writing its temporary output.
interrupt_write() {
  local label=$1 sig=$2 out=$3; shift 3
  # Every signal at its default action in the child: a background job of a script starts with
  # SIGINT and SIGQUIT ignored, a test run itself started in the background (make test &) or
  # under nohup passes ignored signals down, and pollen leaves an ignored signal ignored (SIGINT,
  # SIGTERM, SIGHUP excepted), as nohup expects. (env execs, so $! is pollen.)
  PLN_FAULT_DELAY_MS=100 env --default-signal "$@" >"$TMP/w.out" 2>"$TMP/w.err" &
  local pid=$!
  check "$label: temporary output being written" wait_writing "$out" $pid
  kill -$sig $pid
  wait_exit $pid 60
  check "$label: $sig ends it (exit $RC; 999: still running at the 60 s hang guard)" test "$RC" != 999 -a "$RC" != 0
  check "$label: says why" grep -q "interrupted by SIG$sig; removing the temporary output" "$TMP/w.err"
}
# Every signal whose default action ends the process (SIGXFSZ below: ignored, the write fails).
for sig in TERM INT HUP QUIT PIPE USR1 USR2 ALRM XCPU VTALRM PROF; do
  interrupt_write "reshard" $sig "$TMP/rs" "$POLLEN" reshard $FIX -o "$TMP/rs" --tp 2 --dtype int8 --quiet
  check "reshard, SIG$sig: no output and no temporary sibling" no_leftovers "$TMP/rs"
  interrupt_write "synth" $sig "$TMP/sy" "$POLLEN" synth --model $FIX/config.json -o "$TMP/sy" --quiet
  check "synth, SIG$sig: no output and no temporary sibling" no_leftovers "$TMP/sy"
done
# SIGXFSZ: ignored, so a write over the file size limit fails (EFBIG) and the ordinary error path
# removes the temporary output; sent by kill, it changes nothing
bash -c 'ulimit -f 16; exec "$@"' _ "$POLLEN" reshard $FIX -o "$TMP/fz" --tp 1 --dtype fp16 --quiet 2>"$TMP/fz.err"
RC=$?
check "reshard over the file size limit: fails with an error, not killed by SIGXFSZ (exit $RC)" test $RC = 1
check "reshard over the file size limit: says so" grep -q "File too large" "$TMP/fz.err"
check "reshard over the file size limit: no output and no temporary sibling" no_leftovers "$TMP/fz"
PLN_FAULT_DELAY_MS=20 "$POLLEN" reshard $FIX -o "$TMP/xf" --tp 1 --dtype fp16 --quiet >/dev/null 2>"$TMP/xf.err" &
pid=$!
check "reshard, SIGXFSZ: temporary output being written" wait_writing "$TMP/xf" $pid
kill -XFSZ $pid
wait_exit $pid 120
check "reshard, SIGXFSZ sent: ignored, the run finishes (exit $RC)" test "$RC" = 0
check "reshard, SIGXFSZ sent: the output verifies" "$POLLEN" verify "$TMP/xf" --source $FIX

# a signal its launcher set to be ignored (nohup does so for SIGHUP; here SIGUSR1) stays ignored
PLN_FAULT_DELAY_MS=20 bash -c 'trap "" USR1; exec "$@"' _ "$POLLEN" reshard $FIX -o "$TMP/ig" --tp 1 --dtype fp16 --quiet \
  >/dev/null 2>"$TMP/ig.err" &
pid=$!
check "reshard, SIGUSR1 ignored by its launcher: temporary output being written" wait_writing "$TMP/ig" $pid
kill -USR1 $pid
wait_exit $pid 120
check "reshard, SIGUSR1 ignored by its launcher: still ignored, the run finishes (exit $RC)" test "$RC" = 0
check "reshard, SIGUSR1 ignored by its launcher: the output verifies" "$POLLEN" verify "$TMP/ig" --source $FIX

# ---- a temporary sibling left by a process that no longer exists (SIGKILL) ----
PLN_FAULT_DELAY_MS=100 "$POLLEN" reshard $FIX -o "$TMP/k" --tp 2 --dtype int8 --quiet >/dev/null 2>&1 &
pid=$!
check "reshard to be killed: temporary output being written" wait_writing "$TMP/k" $pid
kill -KILL $pid; wait $pid 2>/dev/null
stale=$(ls -d "$TMP/k".tmp-$pid-* 2>/dev/null)
check "SIGKILL leaves the temporary sibling ($stale)" test -d "$stale"
check "its marker names the process" grep -q "^pollen-tmp $pid " "$stale/.pollen-tmp"
# siblings that must survive: a live process's, an unmarked one, another host's, one holding a directory
bash -c 'exit 0' & dead=$!; wait $dead
mk() { mkdir -p "$1"; echo "x" >"$1/rank-0-of-1.pln"; [ -z "$2" ] || printf 'pollen-tmp %s %s\n' "$2" "$3" >"$1/.pollen-tmp"; }
mk "$TMP/k.tmp-$$-0" $$ "$(hostname)"
mk "$TMP/k.tmp-$dead-7"
mk "$TMP/k.tmp-$dead-8" $dead other-host
mk "$TMP/k.tmp-$dead-9" $dead "$(hostname)"; mkdir "$TMP/k.tmp-$dead-9/sub"
mk "$TMP/k.tmp-$dead-x" $dead "$(hostname)"
check "the next run succeeds" "$POLLEN" reshard $FIX -o "$TMP/k" --tp 1 --dtype fp16 --quiet 2>"$TMP/k.err"
check "and removes the stale sibling" test ! -e "$stale"
check "saying so" grep -q "removed $stale, a temporary output left by process $pid, which no longer runs" "$TMP/k.err"
check "a live process's sibling is left alone" test -f "$TMP/k.tmp-$$-0/rank-0-of-1.pln"
check "an unmarked sibling is left alone" test -f "$TMP/k.tmp-$dead-7/rank-0-of-1.pln"
check "another host's sibling is left alone" test -f "$TMP/k.tmp-$dead-8/rank-0-of-1.pln"
check "a sibling holding a directory is left alone" test -d "$TMP/k.tmp-$dead-9/sub"
check "a name of another form is left alone" test -f "$TMP/k.tmp-$dead-x/rank-0-of-1.pln"
check "the output has no marker" test ! -e "$TMP/k/.pollen-tmp"
check "the output verifies" "$POLLEN" verify "$TMP/k" --source $FIX
# synth cleans up after a killed synth the same way
PLN_FAULT_DELAY_MS=100 "$POLLEN" synth --model $FIX/config.json -o "$TMP/ks" --quiet >/dev/null 2>&1 &
pid=$!
check "synth to be killed: temporary output being written" wait_writing "$TMP/ks" $pid
kill -KILL $pid; wait $pid 2>/dev/null
check "the next synth succeeds and removes the stale sibling" \
  bash -c "'$POLLEN' synth --model $FIX/config.json -o '$TMP/ks' --quiet && test -z \"\$(ls -d '$TMP/ks'.tmp-* 2>/dev/null)\""

# replacing an earlier set with --force, interrupted: the earlier set stays whole
check "an earlier set" "$POLLEN" reshard $FIX -o "$TMP/old" --tp 1 --dtype fp16 --quiet
sum() { (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum; }
before=$(sum "$TMP/old")
interrupt_write "reshard --force over a set" TERM "$TMP/old" "$POLLEN" reshard $FIX -o "$TMP/old" --tp 2 --dtype int8 --quiet --force
check "the earlier set is untouched" test "$(sum "$TMP/old")" = "$before"
check "no temporary sibling" test -z "$(ls -d "$TMP/old".tmp-* "$TMP/old".old-* 2>/dev/null)"
check "the earlier set still verifies" "$POLLEN" verify "$TMP/old" --source $FIX
e2e_done
