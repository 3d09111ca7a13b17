# e2e.sh — sourced by tests/e2e_*.sh: the same CHECK counting as tests/test.h, for shell.
# Each script ends with `e2e_done`, which prints "<name>: N passed, N failed".
E2E_PASS=0; E2E_FAIL=0
E2E_NAME=$(basename "$0" .sh)
POLLEN=${PLN_BUILD:-build}/pollen
TMP=$(mktemp -d "${PLN_TEST_TMP:-/tmp}/$E2E_NAME.XXXXXX")
# pollen's CLI measures the decode GEMVs' prefetch distance once per machine and caches it under
# $XDG_CACHE_HOME (kernels/cpu/tune.c): the tests run the fixed default unless they ask for the
# measurement (e2e_cpu_tune.sh), and never touch the user's cache
export POLLEN_CPU_TUNE=${POLLEN_CPU_TUNE:-off}
export XDG_CACHE_HOME=$TMP/xdg-cache
# start_server NAME [VAR=VALUE...] LAUNCH...: `LAUNCH --port 0 --port-file ... --quiet` in the
# background (leading assignments go to its environment, as with env(1)), its output in
# $TMP/NAME.log. Sets SRV_PID (the launcher), PORT and RANK0 (rank 0's pid, from its start-up
# line); fails when the process ends first or after 30 s.
start_server() {
  local name=$1; shift
  rm -f "$TMP/$name.port"
  env "$@" --port 0 --port-file "$TMP/$name.port" --quiet >"$TMP/$name.log" 2>&1 &
  SRV_PID=$!
  for _ in $(seq 300); do [ -s "$TMP/$name.port" ] && break; kill -0 $SRV_PID 2>/dev/null || break; sleep 0.1; done
  PORT=$(cat "$TMP/$name.port" 2>/dev/null)
  RANK0=$(sed -n 's/^pollen serve: .* pid \([0-9]*\)$/\1/p' "$TMP/$name.log" | head -n 1)
  [ -n "$PORT" ] && [ -n "$RANK0" ]
}
# stop_server: SIGTERM to rank 0, wait (bounded) for the launcher; returns its exit status (99:
# it had to be killed).
stop_server() {
  kill -TERM "$RANK0" 2>/dev/null
  for _ in $(seq 150); do kill -0 $SRV_PID 2>/dev/null || break; sleep 0.1; done
  if kill -0 $SRV_PID 2>/dev/null; then kill -KILL $SRV_PID; wait $SRV_PID 2>/dev/null; return 99; fi
  wait $SRV_PID
}
# metric NAME: the value of one /metrics line of the server at $PORT (needs $CURL)
metric() { $CURL "http://127.0.0.1:$PORT/metrics" | sed -n "s/^$1 //p"; }
check() { # check "what" cmd...
  local what=$1; shift
  if "$@"; then E2E_PASS=$((E2E_PASS+1)); else E2E_FAIL=$((E2E_FAIL+1)); echo "FAIL: $what" >&2; fi
}
check_fails() { # check_fails "what" "expected stderr regex" cmd...  (must exit non-zero, message must match)
  local what=$1 re=$2; shift 2
  local err; err=$("$@" 2>&1 >/dev/null); local rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && echo "$err" | grep -Eq "$re"; then E2E_PASS=$((E2E_PASS+1));
  else E2E_FAIL=$((E2E_FAIL+1)); echo "FAIL: $what (rc=$rc, stderr: $err)" >&2; fi
}
# check_tp_fidelity RUN LABEL REF_TOL GREEDY_TOL TP_TOL "model src tp tp ..." ...: per fixture model
# (written model:name to compare with its reference-name.safetensors instead of reference-f16),
# reshard to each TP size (fp16), run `RUN TP SET args` (a function that starts `pollen generate`
# with TP ranks) on the four reference prompts with 20 greedy tokens, and compare with
# transformers (prefill logits rel L2 <= REF_TOL, greedy ids identical with log-probs within
# GREEDY_TOL) and, for TP > 1, with the first TP size's logits (rel L2 <= TP_TOL). Needs $CMP
# (build/tests/test_engine).
check_tp_fidelity() {
  local run=$1 label=$2 ref_tol=$3 greedy_tol=$4 tp_tol=$5; shift 5
  local spec model src ref ids tp first set_dir
  for spec in "$@"; do
    set -- $spec; model=${1%%:*}; src=$2; ref=f16; [ "$1" = "$model" ] || ref=${1#*:}; shift 2
    ref=tests/fixtures/models/$model/reference-$ref.safetensors
    ids=$("$CMP" --print-ids "$ref")
    first=$1
    for tp in "$@"; do
      set_dir=$TMP/$model-tp$tp
      check "$model: reshard --tp $tp" "$POLLEN" reshard tests/fixtures/models/$model/$src -o "$set_dir" --tp $tp --dtype fp16 --quiet
      # shellcheck disable=SC2086
      check "$model TP $tp$label: generate" $run $tp "$set_dir" $ids --max-new-tokens 20 --json --quiet \
        --dump-logits "$TMP/$model-tp$tp.st" >"$TMP/$model-tp$tp.json"
      check "$model TP $tp$label: prefill logits vs transformers" "$CMP" --cmp-ref "$TMP/$model-tp$tp.st" "$ref" $ref_tol
      check "$model TP $tp$label: greedy ids and logprobs vs transformers" "$CMP" --cmp-greedy "$TMP/$model-tp$tp.json" "$ref" $greedy_tol
      if [ "$tp" != "$first" ]; then
        check "$model TP $tp$label: logits equal TP $first" "$CMP" --cmp-dump "$TMP/$model-tp$tp.st" "$TMP/$model-tp$first.st" $tp_tol
      fi
    done
  done
}
e2e_done() { echo "$E2E_NAME: $E2E_PASS passed, $E2E_FAIL failed"; [ $E2E_FAIL = 0 ]; }
