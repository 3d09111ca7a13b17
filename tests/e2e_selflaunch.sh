#!/usr/bin/env bash
# e2e_selflaunch.sh — a TP-2 set run without a launcher starts its own 2 ranks under mpirun:
# `generate` gives the output of an explicit `mpirun -np 2` and prints (once, shell-quoted, not
# with --quiet) a command line that gives it too when pasted; `serve` answers /health and
# /generate from a parent that holds neither the port nor the rank files, and SIGTERM or SIGINT
# to that parent drain rank 0 and end every rank with exit 0 (no process of the set left);
# a rank that fails (a corrupted rank-1 file, a --kl-base of another TP) ends the job non-zero
# with that rank's message and no mpirun box after it; a rank killed by a signal is named, and so
# is mpirun failing before any rank ran;
# --no-launch keeps the rank-count error; under an explicit mpirun nothing launches again; no
# mpirun on PATH is a clear error naming the package; more ranks than cores oversubscribe; bench
# and perplexity launch too; a TP-1 set never launches. Every wait is bounded.
source "$(dirname "$0")/e2e.sh"
HELPER=${PLN_BUILD:-build}/tests/test_shard
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; e2e_done; exit; }
command -v curl >/dev/null || { echo "SKIP: curl not installed (make deps)"; e2e_done; exit; }
[ -x "$HELPER" ] || { echo "SKIP: $HELPER not built"; e2e_done; exit; }
export OMP_NUM_THREADS=1
CURL="curl -s --max-time 30"
# A unique path: the processes of this set are found by it (pgrep -f).
S2=$TMP/selflaunch-set-$$; S1=$TMP/selflaunch-tp1-$$
check "sample TP-2 set" "$HELPER" --write-sample "$S2" --tp 2
check "sample TP-1 set" "$HELPER" --write-sample "$S1" --tp 1
left() { pgrep -f -- "$S2" >/dev/null; }
# gone SECONDS: true once no process of the set is left (kills the rest after the bound).
gone() {
  for _ in $(seq $(( $1 * 10 ))); do left || return 0; sleep 0.1; done
  pkill -KILL -f -- "$S2"; return 1
}
# finish PID SECONDS: RC = its exit status; 999 when it had to be killed.
finish() {
  for _ in $(seq $(( $2 * 10 ))); do kill -0 "$1" 2>/dev/null || { wait "$1"; RC=$?; return 0; }; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null; wait "$1" 2>/dev/null; RC=999; return 1
}

# ---- generate: the same output as under mpirun, the printed command ---------------------------
GEN=(generate "$S2" --prompt "Hello world" --token-ids 5,17,42 --max-new-tokens 6)
ref=$(timeout 120 mpirun -np 2 "$POLLEN" "${GEN[@]}" --quiet 2>"$TMP/ref.err"); rc=$?
check "explicit mpirun -np 2: generates (exit $rc)" test $rc = 0 -a -n "$ref"
check "explicit mpirun: no second launch" bash -c "! grep -q 'starting 2 ranks' '$TMP/ref.err'"
out=$(timeout 120 "$POLLEN" "${GEN[@]}" --quiet 2>"$TMP/self.err"); rc=$?
check "self-launched: exit 0 (got $rc)" test $rc = 0
check "self-launched: the same text as under mpirun" test -n "$out" -a "$out" = "$ref"
check "--quiet: no launch line" bash -c "! grep -q 'starting' '$TMP/self.err'"
timeout 120 "$POLLEN" "${GEN[@]}" 2>"$TMP/loud.err" >"$TMP/loud.out"
cat "$TMP/loud.err"
check "launch line printed once" test "$(grep -c '^pollen: starting 2 ranks: mpirun -np 2 ' "$TMP/loud.err")" = 1
check "launch line: the prompt shell-quoted" grep -q "generate $S2 --prompt 'Hello world' --token-ids 5,17,42 --max-new-tokens 6\$" "$TMP/loud.err"
check "launch line: ranks unbound (each has the cores / 2 threads)" grep -q "starting 2 ranks: .* --bind-to none " "$TMP/loud.err"
if [ "$(id -u)" = 0 ]; then
  check "launch line: --allow-run-as-root as root" grep -q "starting 2 ranks: .* --allow-run-as-root " "$TMP/loud.err"
fi
LINE=$(sed -n 's/^pollen: starting 2 ranks: //p' "$TMP/loud.err")
pasted=$(timeout 120 bash -c "$LINE --quiet" 2>"$TMP/pasted.err"); rc=$?
check "the printed command works when pasted (exit $rc)" test $rc = 0
check "pasted: the same text" test -n "$pasted" -a "$pasted" = "$ref"
check "pasted: no second launch" bash -c "! grep -q 'starting' '$TMP/pasted.err'"
check "no rank left after generate" gone 10

# ---- more ranks than cores: pollen asks Open MPI to oversubscribe (not the test's environment) ---
S4=$TMP/selflaunch-tp4-$$
check "sample TP-4 set" "$HELPER" --write-sample "$S4" --tp 4
ref4=$(timeout 120 mpirun -np 4 --oversubscribe "$POLLEN" generate "$S4" --token-ids 5,6,7 --max-new-tokens 3 2>/dev/null)
out4=$(env -u OMPI_MCA_rmaps_base_oversubscribe timeout 120 "$POLLEN" generate "$S4" --token-ids 5,6,7 --max-new-tokens 3 2>"$TMP/tp4.err")
check "TP 4 self-launched: the ids of an explicit mpirun -np 4" test -n "$ref4" -a "$out4" = "$ref4"
if [ "$(nproc)" -lt 4 ]; then
  check "TP 4 on $(nproc) cores: --oversubscribe in the launch line" grep -q "starting 4 ranks: .* --oversubscribe " "$TMP/tp4.err"
fi

# ---- --no-launch, TP 1, no mpirun ---------------------------------------------------------------
check_fails "--no-launch: the rank-count error" "TP=2 but 1 rank was started" timeout 60 "$POLLEN" generate "$S2" --prompt hi --no-launch
out=$(timeout 60 "$POLLEN" generate "$S1" --prompt hi --max-new-tokens 2 2>&1 >/dev/null); rc=$?
check "TP-1 set: runs here, no launch (exit $rc)" test $rc = 0 -a -z "$(grep starting <<<"$out")"
NOMPI=$TMP/nompi; mkdir -p "$NOMPI"
check_fails "no mpirun on PATH: names the package" "no mpirun is on PATH: install it \(apt-get install openmpi-bin\)" \
  env PATH="$NOMPI" "$POLLEN" generate "$S2" --prompt hi
out=$("$POLLEN" generate --help)
check "generate --help names --no-launch" grep -q -- "--no-launch" <<<"$out"

# ---- a rank that fails --------------------------------------------------------------------------
BAD=$TMP/selflaunch-bad-$$
cp -r "$S2" "$BAD"
# Same size (the manifest's checks pass, so the parent launches): rank 1 finds no pollen preamble.
printf 'garbage!' | dd of="$BAD/rank-1-of-2.pln" bs=1 count=8 conv=notrunc status=none
err=$(timeout 120 "$POLLEN" generate "$BAD" --prompt hi --quiet 2>&1 >/dev/null); rc=$?
echo "$err" | tail -n 5
check "corrupted rank-1 file: exit non-zero, not a hang (exit $rc)" test $rc != 0 -a $rc != 124
check "corrupted rank-1 file: rank 1's message names the file" grep -q "rank 1: .*rank-1-of-2.pln" <<<"$err"
check "corrupted rank-1 file: no Open MPI box repeating it (mpirun -q)" bash -c "! grep -Eq 'Primary job|mpirun detected' <<<'$err'"
check "corrupted rank-1 file: the ranks ran (no 'before any rank ran')" bash -c "! grep -q 'before any rank ran' <<<'$err'"
# mpirun itself failing (-q hides its message): pollen says so and gives the command to see why
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  err=$(OMPI_MCA_rmaps_base_mapping_policy=bogus timeout 120 "$POLLEN" generate "$S2" --prompt hi --quiet 2>&1 >/dev/null); rc=$?
  check "mpirun failing before any rank: exit non-zero (got $rc)" test $rc != 0 -a $rc != 124
  check "... pollen says mpirun failed and how to see why" \
    grep -q "^pollen generate: mpirun exited with status [0-9]* before any rank ran; run its command without -q to see why: mpirun -np 2 " <<<"$err"
fi
bad_gone() { for _ in $(seq 100); do pgrep -f -- "$BAD" >/dev/null || return 0; sleep 0.1; done; pkill -KILL -f -- "$BAD"; return 1; }
check "no rank of the bad set left" bad_gone

# ---- serve: health, a request, signals to the parent --------------------------------------------
for sig in TERM INT; do
  check "serve self-launched starts ($sig case)" start_server "srv$sig" "$POLLEN" serve "$S2"
  check "$sig case: /health answers 200" test "$($CURL -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200
  if [ $sig = TERM ]; then
    gen=$($CURL "http://127.0.0.1:$PORT/generate" -H 'Content-Type: application/json' \
      -d '{"inputs":"Hello world","parameters":{"max_new_tokens":4}}')
    check "a generate request answers" grep -q '"generated_text":"' <<<"$gen"
    check "/info reports tp 2" grep -q '"tp":2' <<<"$($CURL "http://127.0.0.1:$PORT/info")"
    check "parent is not rank 0" test "$RANK0" != "$SRV_PID"
    check "parent holds no socket" bash -c "! ls -l /proc/$SRV_PID/fd 2>/dev/null | grep -q socket:"
    check "parent maps no rank file" bash -c "! grep -q '\.pln' /proc/$SRV_PID/maps"
    check "two ranks run" test "$(pgrep -f -- "serve $S2" | wc -l)" -ge 3
  fi
  kill -$sig "$SRV_PID"
  finish "$SRV_PID" 60
  check "SIG$sig to the parent: exit 0 (got $RC)" test "$RC" = 0
  check "SIG$sig: rank 0 drained" grep -q "SIG$sig: draining" "$TMP/srv$sig.log"
  check "SIG$sig: no rank left" gone 10
done
# A signal while the ranks load: every rank ends, non-zero, with rank 0's word on why.
rm -f "$TMP/load.err"
PLN_TEST_LOAD_DELAY_MS=120000 "$POLLEN" serve "$S2" --port 0 --quiet 2>"$TMP/load.err" &
PID=$!
for _ in $(seq 300); do grep -q "rank 0 (pid [0-9]*) pausing" "$TMP/load.err" 2>/dev/null && break; sleep 0.1; done
kill -TERM $PID
finish $PID 60
check "SIGTERM during load: ends it, not the pause (exit $RC)" test "$RC" != 999 -a "$RC" != 0
check "SIGTERM during load: says why" grep -q "SIGTERM during start-up" "$TMP/load.err"
check "SIGTERM during load: no rank left" gone 10

# ---- bench and perplexity launch too ------------------------------------------------------------
out=$(timeout 120 "$POLLEN" bench "$S2" --prompt-len 8 --batch 1 --steps 2 --context 4 --stream-mib 8 --json 2>/dev/null); rc=$?
check "bench self-launched: TP 2 results (exit $rc)" grep -q '"tp":2' <<<"$out"
printf 'Hello world. This is a test of the self launch, with a few words to score.\n' >"$TMP/text.txt"
out=$(timeout 120 "$POLLEN" perplexity "$S2" --file "$TMP/text.txt" --ctx 8 --json 2>/dev/null)
check "perplexity self-launched: TP 2 results" grep -q '"tp":2' <<<"$out"
check "perplexity self-launched: a perplexity" grep -q '"ppl":[0-9]' <<<"$out"
# rank 0 refuses (a base of another TP): its message alone, not mpirun's boxes nor rank 1's SIGTERM
err=$(timeout 120 "$POLLEN" perplexity "$S2" --file "$TMP/text.txt" --kl-base "$S1" --quiet 2>&1 >/dev/null); rc=$?
check "perplexity --kl-base of another TP, self-launched: exit 1 (got $rc)" test $rc = 1
check "... rank 0's message" grep -q "the base set is TP=1 and .* is TP=2" <<<"$err"
check "... and nothing else (no mpirun box, no 'interrupted by SIGTERM' from rank 1)" test "$(wc -l <<<"$err")" = 1
# a rank killed by a signal: mpirun -q says nothing of it, pollen does
check "serve self-launched starts (rank-1 kill case)" start_server srvkill "$POLLEN" serve "$S2"
R1=
for p in $(pgrep -f -- "serve $S2"); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && R1=$p
done
check "rank 1 found" test -n "$R1"
kill -KILL "$R1" 2>/dev/null
finish "$SRV_PID" 60
check "rank 1 killed: the parent exits non-zero (got $RC)" test "$RC" != 0 -a "$RC" != 999
check "rank 1 killed: pollen names the signal" grep -q "^pollen serve: a rank was killed by signal 9 " "$TMP/srvkill.log"
check "nothing of the set left at the end" gone 10
e2e_done
