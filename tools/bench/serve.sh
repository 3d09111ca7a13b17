#!/usr/bin/env bash
# serve.sh — load benchmark of `pollen serve` on a synthesized model (CPU backend): 1, 8, 32 and
# 64 concurrent streaming clients for a bounded time each, from a separate load generator
# (tools/bench/loadgen.c, built here with cc). Reports generated tokens/s, p50/p99 time to first
# token and per output token, failed requests, the 32-vs-1 throughput ratio (continuous batching
# pays when it is >= 8), how long a short request takes behind a long one, and the ceiling: the
# engine alone (`pollen generate`, no HTTP) at batch 1 and 32 in the same run.
#
#   tools/bench/serve.sh                       # bloom-560m shapes, 2 layers, 20 s per level
#   LAYERS=4 DURATION=30 CLIENTS="1 8 32 64" MAX_NEW=16 tools/bench/serve.sh
# Prints a markdown table for docs/BENCHMARKS.md ("Serving") with the command, date and machine.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
POLLEN=$BUILD/pollen
MODEL=${MODEL:-bloom-560m}
LAYERS=${LAYERS:-2}
DURATION=${DURATION:-20}
MAX_NEW=${MAX_NEW:-16}
CLIENTS=${CLIENTS:-"1 8 32 64"}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pln-bench-serve.XXXXXX")
SRV_PID=
cleanup() { [ -n "$SRV_PID" ] && kill -TERM "$SRV_PID" 2>/dev/null && wait "$SRV_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

[ -x "$POLLEN" ] || make -j"$(nproc)" "$POLLEN" >/dev/null
cc -O2 -Wall -pthread tools/bench/loadgen.c -o "$WORK/loadgen"
echo "synthesizing $MODEL with $LAYERS layers and resharding to TP 1 ..." >&2
"$POLLEN" synth --model "$MODEL" --layers "$LAYERS" -o "$WORK/ck" --quiet
"$POLLEN" reshard "$WORK/ck" -o "$WORK/tp1" --tp 1 --dtype fp16 --quiet
rm -rf "$WORK/ck"

# The ceiling on this machine in this run: the engine alone (pollen generate, no HTTP), at batch 1
# and at batch 32, same prompt and token count.
ceiling() { # batch -> generated tokens/s of the decode steps
  local args=() i
  for i in $(seq "$1"); do args+=(--prompt "The history of the bloom"); done
  "$POLLEN" generate "$WORK/tp1" "${args[@]}" --max-new-tokens "$MAX_NEW" --temperature 0 --json --quiet 2>/dev/null |
    sed -n 's/.*"decode_ms_per_step":\([0-9.]*\).*/\1/p' | awk -v b="$1" '{ printf "%.2f", b * 1000 / $1 }'
}
C1=$(ceiling 1); C32=$(ceiling 32)

# Every client comes from 127.0.0.1: no per-client connection limit (it defaults to 64).
"$POLLEN" serve "$WORK/tp1" --port 0 --port-file "$WORK/port" --quiet --max-seqs 64 --max-connections-per-client 0 \
    --max-concurrent-requests 256 --max-batch-tokens 1024 --kv-tokens 16384 >"$WORK/server.log" 2>&1 &
SRV_PID=$!
for _ in $(seq 600); do [ -s "$WORK/port" ] && break; kill -0 $SRV_PID || { cat "$WORK/server.log"; exit 1; }; sleep 0.1; done
PORT=$(cat "$WORK/port")

field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }
echo "| clients | requests | failed | tokens/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
declare -A TPS
for c in $CLIENTS; do
  line=$("$WORK/loadgen" --port "$PORT" --clients "$c" --duration "$DURATION" --max-new-tokens "$MAX_NEW" --label "$c" || true)
  echo "$line" >>"$WORK/results.jsonl"
  TPS[$c]=$(field tokens_per_s <<<"$line")
  printf "| %s | %s | %s | %s | %s s | %s s | %s s | %s s |\n" "$c" "$(field requests <<<"$line")" "$(field failed <<<"$line")" \
    "${TPS[$c]}" "$(field ttft_p50_s <<<"$line")" "$(field ttft_p99_s <<<"$line")" "$(field tpot_p50_s <<<"$line")" \
    "$(field tpot_p99_s <<<"$line")"
done
if [ -n "${TPS[1]:-}" ] && [ -n "${TPS[32]:-}" ]; then
  awk -v a="${TPS[1]}" -v b="${TPS[32]}" 'BEGIN { r = b / a; printf "\nthroughput 32 clients / 1 client: %.1fx (%s)\n", r, (r >= 8 ? "continuous batching pays: >= 8x" : "BELOW the 8x target") }'
fi
echo "engine alone (pollen generate, no HTTP, decode steps): $C1 tokens/s at batch 1, $C32 tokens/s at batch 32"
sbl=$("$WORK/loadgen" --port "$PORT" --short-behind-long 64 4 --label sbl || true)
printf "short request (4 tokens): alone %s s, behind a running 64-token request %s s (the long one took %s s)\n" \
  "$(field short_alone_s <<<"$sbl")" "$(field short_behind_long_s <<<"$sbl")" "$(field long_total_s <<<"$sbl")"
echo
echo "model: $MODEL shapes, $LAYERS layers, fp16 shards, TP 1, CPU backend; $MAX_NEW new tokens per request, ${DURATION} s per level"
echo "command: LAYERS=$LAYERS DURATION=$DURATION MAX_NEW=$MAX_NEW CLIENTS=\"$CLIENTS\" tools/bench/serve.sh"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), load average $(cut -d' ' -f1-3 /proc/loadavg)"
