#!/usr/bin/env bash
# e2e_share.sh — KV block sharing changes no output: a TP-1 and (under mpirun) a TP-2 server with
# sharing (prefix cache + n/best_of forks, the default) and one with --no-block-sharing answer the
# same requests — a cold prompt, the same prompt again (prefix cache hit), n = 3 and best_of = 3
# with a seed (forks), a prompt that extends a cached one — with byte-identical JSON (texts,
# token log-probs, alternatives), and /metrics shows the sharing happened (or did not). Both run
# --batch-invariant: a prefix-cache hit prefills only the prompt's suffix, fewer tokens than the
# whole prompt, and without the flag the CPU backend may order those sums differently
# (kernels/cpu/cpu.h pln_cpu_set_batch_invariant), which is rounding, not sharing.
# Ports are chosen by the kernel (--port 0 --port-file); every wait is bounded.
source "$(dirname "$0")/e2e.sh"
HELPER=${PLN_BUILD:-build}/tests/test_shard
command -v curl >/dev/null || { echo "SKIP: curl not installed (make deps)"; e2e_done; exit; }
[ -x "$HELPER" ] || { echo "SKIP: $HELPER not built"; e2e_done; exit; }
CURL="curl -s --max-time 60"

# post PATH BODY: the answer without its per-request id and creation time
post() { $CURL -X POST -H 'Content-Type: application/json' "http://127.0.0.1:$PORT$1" -d "$2" |
         sed -e 's/"id":"cmpl-[0-9a-f]*",//' -e 's/"created":[0-9]*,//'; echo; }

LONG="The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat by the door"
run_requests() { # OUT: every answer, one per line
  {
    post /v1/completions "{\"prompt\":\"$LONG\",\"max_tokens\":10,\"temperature\":0,\"logprobs\":2}"
    post /v1/completions "{\"prompt\":\"$LONG\",\"max_tokens\":10,\"temperature\":0,\"logprobs\":2}"
    post /v1/completions "{\"prompt\":\"$LONG\",\"max_tokens\":10,\"n\":3,\"seed\":5,\"logprobs\":1}"
    post /v1/completions "{\"prompt\":\"$LONG\",\"max_tokens\":10,\"n\":1,\"best_of\":3,\"seed\":9,\"logprobs\":1}"
    post /generate "{\"inputs\":\"$LONG and the dog\",\"parameters\":{\"max_new_tokens\":10,\"details\":true,\"top_n_tokens\":2}}"
    post /generate "{\"inputs\":\"$LONG\",\"parameters\":{\"max_new_tokens\":6,\"do_sample\":true,\"seed\":3,\"details\":true}}"
  } >"$1"
}

S1=$TMP/s1; S2=$TMP/s2
check "sample TP-1 set" "$HELPER" --write-sample "$S1" --tp 1
check "sample TP-2 set" "$HELPER" --write-sample "$S2" --tp 2
LAUNCH1=""
LAUNCH2=""
command -v mpirun >/dev/null && LAUNCH2="mpirun -np 2"
for tp in 1 2; do
  if [ $tp = 2 ] && [ -z "$LAUNCH2" ]; then echo "SKIP: TP 2 (mpirun not installed)"; break; fi
  L=LAUNCH$tp; SET=S$tp
  # shellcheck disable=SC2086
  check "TP $tp: server with sharing starts" start_server share$tp ${!L} "$POLLEN" serve "${!SET}" --block-size 4 --batch-invariant
  run_requests "$TMP/share$tp.out"
  HIT=$(metric pln_prefix_cache_hit_tokens_total); FORK=$(metric pln_kv_fork_tokens_total)
  check "TP $tp: the repeated prompt hit the prefix cache ($HIT tokens)" test "${HIT:-0}" -gt 0
  check "TP $tp: n/best_of forked blocks ($FORK tokens)" test "${FORK:-0}" -gt 0
  check "TP $tp: every block back once idle" test "$(metric pln_kv_blocks_free)" = "$(metric pln_kv_blocks_total)"
  check "TP $tp: sharing server stops cleanly" stop_server
  # shellcheck disable=SC2086
  check "TP $tp: server without sharing starts" start_server plain$tp ${!L} "$POLLEN" serve "${!SET}" --block-size 4 --no-block-sharing --batch-invariant
  run_requests "$TMP/plain$tp.out"
  check "TP $tp: no sharing happened" test "$(metric pln_prefix_cache_hit_tokens_total)" = 0 -a "$(metric pln_kv_fork_tokens_total)" = 0
  check "TP $tp: server without sharing stops cleanly" stop_server
  check "TP $tp: 6 answers" test "$(grep -c '"finish_reason"' "$TMP/share$tp.out")" = 6
  check "TP $tp: outputs identical with and without sharing" cmp "$TMP/share$tp.out" "$TMP/plain$tp.out"
  cmp -s "$TMP/share$tp.out" "$TMP/plain$tp.out" || diff "$TMP/share$tp.out" "$TMP/plain$tp.out" | head -5 >&2
done

# The quantized sets, on every integer path: a prefix-cache hit leaves a one-token suffix, which
# must take a batch's bits too (int8 with the integer-dot path, int4 grouped; both once differed).
FX=tests/fixtures/models/bloom-4h/fp16-st
check "reshard int8 g32" "$POLLEN" reshard $FX -o "$TMP/q8" --tp 1 --dtype int8 --group-size 32 --quiet
check "reshard int4 g32" "$POLLEN" reshard $FX -o "$TMP/q4" --tp 1 --dtype int4 --group-size 32 --quiet
for v in "q8 --int-dot on" "q8 --int-dot off" "q4 --int-dot on" "q4 --int-dot off"; do
  set -- $v; q=$1; shift
  check "$q $*: server with sharing starts" start_server sh-$q$2 "$POLLEN" serve "$TMP/$q" --block-size 4 --batch-invariant "$@"
  run_requests "$TMP/sh-$q$2.out"
  HIT=$(metric pln_prefix_cache_hit_tokens_total)
  check "$q $*: the repeated prompt hit the prefix cache ($HIT tokens)" test "${HIT:-0}" -gt 0
  check "$q $*: sharing server stops cleanly" stop_server
  check "$q $*: server without sharing starts" start_server pl-$q$2 "$POLLEN" serve "$TMP/$q" --block-size 4 --no-block-sharing --batch-invariant "$@"
  run_requests "$TMP/pl-$q$2.out"
  check "$q $*: server without sharing stops cleanly" stop_server
  check "$q $*: 6 answers" test "$(grep -c '"finish_reason"' "$TMP/sh-$q$2.out")" = 6
  check "$q $*: outputs identical with and without sharing" cmp "$TMP/sh-$q$2.out" "$TMP/pl-$q$2.out"
  cmp -s "$TMP/sh-$q$2.out" "$TMP/pl-$q$2.out" || diff "$TMP/sh-$q$2.out" "$TMP/pl-$q$2.out" | head -5 >&2
done
e2e_done
