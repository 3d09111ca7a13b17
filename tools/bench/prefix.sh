#!/usr/bin/env bash
# prefix.sh — what the prefix cache buys: time to first token of a request whose prompt starts
# with a 1,000-token prefix that an earlier request already computed, against the first
# (cold) request, on a synthesized model (CPU backend), with the cache on and with
# --no-prefix-cache. Each trial uses a fresh prefix (so the first request is cold) and two
# different suffixes; max_new_tokens is 1, so a request's latency is its time to first token.
#
#   tools/bench/prefix.sh                          # bloom-560m shapes, 2 layers, 3 trials
#   LAYERS=4 TRIALS=5 PREFIX_TOKENS=1000 tools/bench/prefix.sh
# Prints a markdown table for docs/BENCHMARKS.md with the command, date and machine.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
POLLEN=$BUILD/pollen
MODEL=${MODEL:-bloom-560m}
LAYERS=${LAYERS:-2}
TRIALS=${TRIALS:-3}
PREFIX_TOKENS=${PREFIX_TOKENS:-1000}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pln-bench-prefix.XXXXXX")
SRV_PID=
cleanup() { [ -n "$SRV_PID" ] && kill -TERM "$SRV_PID" 2>/dev/null && wait "$SRV_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
[ -x "$POLLEN" ] || make -j"$(nproc)" "$POLLEN" >/dev/null
echo "synthesizing $MODEL with $LAYERS layers and resharding to TP 1 ..." >&2
"$POLLEN" synth --model "$MODEL" --layers "$LAYERS" -o "$WORK/ck" --quiet
"$POLLEN" reshard "$WORK/ck" -o "$WORK/tp1" --tp 1 --dtype fp16 --quiet
rm -rf "$WORK/ck"

start() { # extra serve flags
  rm -f "$WORK/port"
  "$POLLEN" serve "$WORK/tp1" --port 0 --port-file "$WORK/port" --quiet --max-input-tokens 1500 \
    --max-total-tokens 1600 --max-batch-tokens 2048 "$@" >"$WORK/log" 2>&1 &
  SRV_PID=$!
  for _ in $(seq 600); do [ -s "$WORK/port" ] && break; sleep 0.1; done
  PORT=$(cat "$WORK/port")
}
stop() { kill -TERM "$SRV_PID"; wait "$SRV_PID" 2>/dev/null || true; SRV_PID=; }
ntok() { curl -s "http://127.0.0.1:$PORT/tokenize" -d "{\"inputs\":\"$1\"}" | grep -o '"id"' | wc -l; }
ttft() { # prompt -> seconds for one generated token (fails unless the answer is 200)
  local r
  r=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' "http://127.0.0.1:$PORT/generate" \
    -d "{\"inputs\":\"$1\",\"parameters\":{\"max_new_tokens\":1}}")
  [ "${r% *}" = 200 ] || { echo "request failed: HTTP ${r% *}" >&2; exit 1; }
  echo "${r#* }"
}
# A prefix of about PREFIX_TOKENS tokens, different per trial (words from a counter).
prefix() {
  local t=$1 s="" i=0
  while :; do
    s="$s trial $t item $i of the shared context,"
    i=$((i + 1))
    if [ $((i % 4)) = 0 ] && [ "$(ntok "$s")" -ge "$PREFIX_TOKENS" ]; then break; fi
  done
  echo "$s"
}
measure() { # label flags... -> rows "label | trial | n | cold | warm | ratio"
  local label=$1; shift
  start "$@"
  for t in $(seq "$TRIALS"); do
    local p; p=$(prefix "$label$t")
    local n; n=$(ntok "$p")
    local a b
    a=$(ttft "$p Question: what comes first?")
    b=$(ttft "$p Question: what comes last?")
    awk -v l="$label" -v t="$t" -v n="$n" -v a="$a" -v b="$b" \
      'BEGIN { printf "| %s | %d | %d | %.1f | %.1f | %.1fx |\n", l, t, n, a * 1000, b * 1000, a / b }'
  done
  echo "<!-- $label: $(curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^pln_prefix_cache_(hit|query)_tokens_total' | tr '\n' ' ')-->"
  stop
}
echo "### Prefix cache: time to first token with a shared ${PREFIX_TOKENS}-token prefix"
echo
echo "\`LAYERS=$LAYERS TRIALS=$TRIALS PREFIX_TOKENS=$PREFIX_TOKENS tools/bench/prefix.sh\` — $(date -u +%Y-%m-%d), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
echo
echo "| server | trial | prefix tokens | first request TTFT (ms) | second request TTFT (ms) | ratio |"
echo "| --- | --- | --- | --- | --- | --- |"
measure "prefix cache"
measure "--no-prefix-cache" --no-prefix-cache
