#!/usr/bin/env bash
# e2e_kv_dtype.sh — `--kv-dtype f16` (the CPU backend's opt-in F16 KV cache) end to end on bloom-4h
# fp16 shards: prefill logits within 1e-3 of transformers and the 20-step greedy continuations
# identical, TP 2 under mpirun equal to TP 1 (logits within 1e-5, same ids), the dtype reported by
# generate --json, bench and serve's /info, and clear refusals of a bad value and of f32 on cuda.
source "$(dirname "$0")/e2e.sh"
CMP=${PLN_BUILD:-build}/tests/test_engine
if ! "$POLLEN" reshard --help >/dev/null 2>&1 || ! command -v mpirun >/dev/null || [ ! -x "$CMP" ]; then
  echo "SKIP: needs pollen reshard, mpirun and $CMP"; e2e_done; exit 0
fi
export OMP_NUM_THREADS=1
model=bloom-4h
ref=tests/fixtures/models/$model/reference-f16.safetensors
ids=$("$CMP" --print-ids "$ref")
for tp in 1 2; do
  check "reshard --tp $tp" "$POLLEN" reshard tests/fixtures/models/$model/fp16-st -o "$TMP/tp$tp" --tp $tp --dtype fp16 --quiet
done
# shellcheck disable=SC2086
check "TP 1 f16: generate" "$POLLEN" generate "$TMP/tp1" $ids --max-new-tokens 20 --json --quiet --kv-dtype f16 \
  --dump-logits "$TMP/tp1.st" >"$TMP/tp1.json"
check "TP 1 f16: prefill logits vs transformers" "$CMP" --cmp-ref "$TMP/tp1.st" "$ref" 1e-3
check "TP 1 f16: greedy ids and logprobs vs transformers" "$CMP" --cmp-greedy "$TMP/tp1.json" "$ref" 2e-3
check "TP 1 f16: --json reports the KV dtype" grep -q '"kv_dtype":"f16"' "$TMP/tp1.json"
# shellcheck disable=SC2086
check "TP 2 f16: generate under mpirun" mpirun -np 2 "$POLLEN" generate "$TMP/tp2" $ids --max-new-tokens 20 --json \
  --quiet --kv-dtype f16 --dump-logits "$TMP/tp2.st" >"$TMP/tp2.json"
check "TP 2 f16: logits equal TP 1 f16" "$CMP" --cmp-dump "$TMP/tp2.st" "$TMP/tp1.st" 1e-5
check "TP 2 f16: greedy ids equal TP 1 f16" test "$(grep -o '"ids":\[[0-9,]*\]' "$TMP/tp2.json")" = \
  "$(grep -o '"ids":\[[0-9,]*\]' "$TMP/tp1.json")"
check "TP 2 f16: ids found" test "$(grep -o '"ids":\[[0-9,]*\]' "$TMP/tp1.json" | wc -l)" = 4
# The CPU default stays F32; asking for it explicitly changes nothing.
"$POLLEN" generate "$TMP/tp1" --token-ids 5,17,42 --max-new-tokens 6 --json --quiet >"$TMP/def.json"
"$POLLEN" generate "$TMP/tp1" --token-ids 5,17,42 --max-new-tokens 6 --json --quiet --kv-dtype f32 >"$TMP/f32.json"
check "default KV dtype on cpu is f32" grep -q '"kv_dtype":"f32"' "$TMP/def.json"
check "--kv-dtype f32 gives the default's tokens" test "$(grep -o '"ids":\[[0-9,]*\]' "$TMP/def.json")" = \
  "$(grep -o '"ids":\[[0-9,]*\]' "$TMP/f32.json")"
out=$("$POLLEN" bench "$TMP/tp1" --prompt-len 8 --batch 1,2 --steps 2 --context 20 --stream-mib 8 --kv-dtype f16 --json 2>/dev/null)
check "bench --kv-dtype f16 reports it" grep -q '"kv_dtype":"f16"' <<<"$out"
# Refusals: before anything loads, naming the option and the value.
for cmd in generate bench serve; do
  extra=; [ $cmd = generate ] && extra="--prompt hi"
  # shellcheck disable=SC2086
  check_fails "$cmd --kv-dtype x" 'pollen: --kv-dtype x: not a KV-cache dtype \(f32 or f16\)' \
    "$POLLEN" $cmd "$TMP/tp1" $extra --kv-dtype x
  # shellcheck disable=SC2086
  check_fails "$cmd --kv-dtype f32 --backend cuda" 'pollen: --kv-dtype f32: the cuda backend keeps its KV cache in f16 only' \
    "$POLLEN" $cmd "$TMP/tp1" $extra --kv-dtype f32 --backend cuda
done
# serve: /info reports the KV dtype, and an F16 server answers.
if command -v curl >/dev/null; then
  "$POLLEN" serve "$TMP/tp1" --kv-dtype f16 --port 0 --port-file "$TMP/port" --quiet >"$TMP/serve.log" 2>&1 &
  SRV=$!
  for _ in $(seq 300); do [ -s "$TMP/port" ] && break; kill -0 $SRV 2>/dev/null || break; sleep 0.1; done
  PORT=$(cat "$TMP/port" 2>/dev/null)
  check "serve --kv-dtype f16 starts" test -n "$PORT"
  info=$(curl -s --max-time 30 "http://127.0.0.1:$PORT/info")
  check "/info reports kv_dtype f16" grep -q '"kv_dtype":"f16"' <<<"$info"
  gen=$(curl -s --max-time 30 -X POST "http://127.0.0.1:$PORT/generate" -H 'Content-Type: application/json' \
    -d '{"inputs":"Hello world","parameters":{"max_new_tokens":4}}')
  check "an F16-KV server generates" grep -q '"generated_text"' <<<"$gen"
  kill -TERM $SRV 2>/dev/null
  for _ in $(seq 150); do kill -0 $SRV 2>/dev/null || break; sleep 0.1; done
  kill -0 $SRV 2>/dev/null && kill -KILL $SRV
  wait $SRV 2>/dev/null
fi
e2e_done
