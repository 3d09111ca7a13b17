#!/usr/bin/env bash
# e2e_llama.sh — the Llama family (llama, mistral, qwen2) end to end on the CPU backend, against
# the transformers fixtures (tests/fixtures/make_llama_fixtures.py): reshard from bf16 sharded
# safetensors, fp16 and fp32 .bin and fp16 safetensors; `pollen generate` under mpirun at every TP
# size the heads allow (TP above the KV-head count included, where KV heads are replicated):
# prefill logits and the 20-step greedy continuations' ids and log-probs against transformers,
# every TP size equal to TP 1 within 1e-5; int8 (per row, grouped with an int8 embedding and
# lm_head) and int4 within the bound of their recorded quantization error; verify --source over
# the fused tensors; the document's stdlib reader and inspect; Mistral's sliding window (the
# mistral-sw weights with sliding_window 8, prompts and 20 greedy tokens well past it, against
# transformers at every TP size); and the refusals (a TP size the heads do not allow, an
# unsupported rope_scaling or model_type, Qwen2's per-layer windows).
source "$(dirname "$0")/e2e.sh"
CMP=${PLN_BUILD:-build}/tests/test_engine
if ! "$POLLEN" reshard --help >/dev/null 2>&1 || ! command -v mpirun >/dev/null || [ ! -x "$CMP" ]; then
  echo "SKIP: needs pollen reshard, mpirun and $CMP"; e2e_done; exit 0
fi
export OMP_NUM_THREADS=1
M=tests/fixtures/models
run_np() { # run_np N args...: generate under mpirun (N = 1 runs without a launcher)
  local n=$1; shift
  if [ "$n" = 1 ]; then "$POLLEN" generate "$@"; else mpirun -np "$n" "$POLLEN" generate "$@"; fi
}
# The CPU is the reference: transformers' fp32 forward on the same rounded weights, so the
# tolerances are tight (the BLOOM ones are 1e-3 / 2e-3).
check_tp_fidelity run_np "" 1e-5 1e-4 1e-5 "llama-gqa:bf16 bf16-st 1 2 4 8" "llama3-tied fp16-bin 1 2 4" \
  "qwen2-bias fp32-bin 1 2 6" "mistral-sw fp16-st 1 2 4"

# int8 and int4 against fp16 at TP 1 (prefill rows), within the bound of the recorded error.
for spec in "llama-gqa bf16-st int8 2" "llama-gqa bf16-st int8-g32-emb 2" "llama-gqa bf16-st int4 1" "llama-gqa bf16-st int4 2" \
            "qwen2-bias fp32-bin int8 2" "qwen2-bias fp32-bin int4 1" "llama3-tied fp16-bin int8-g32-emb 2"; do
  read -r model src q tp <<<"$spec"
  ids=$("$CMP" --print-ids "$M/$model/reference-f16.safetensors")
  case $q in
    int8) opt=(--dtype int8) ;;
    int8-g32-emb) opt=(--dtype int8 --group-size 32 --quantize-embedding) ;;
    int4) opt=(--dtype int4 --group-size 32) ;;
  esac
  d=$TMP/$model-$q-tp$tp
  check "$model $q TP $tp: reshard" "$POLLEN" reshard "$M/$model/$src" -o "$d" --tp "$tp" "${opt[@]}" --quiet
  # shellcheck disable=SC2086
  check "$model $q TP $tp: generate" run_np "$tp" "$d" $ids --max-new-tokens 1 --quiet --dump-logits "$d.st"
  # shellcheck disable=SC2086
  [ -f "$TMP/$model-f16-1.st" ] || check "$model fp16 TP 1: generate" run_np 1 "$TMP/$model-tp1" $ids --max-new-tokens 1 --quiet \
    --dump-logits "$TMP/$model-f16-1.st"
  check "$model $q TP $tp: within the quantization bound" "$CMP" --cmp-int8 "$d.st" "$TMP/$model-f16-1.st" "$d"
done
check "llama-gqa int4: TP 2 = TP 1" "$CMP" --cmp-dump "$TMP/llama-gqa-int4-tp2.st" "$TMP/llama-gqa-int4-tp1.st" 1e-5

# The quality meter on a Llama set: int4 g32 against fp16 on held-out text (the Apache license's
# first 3000 bytes; the models trained on it too, so perplexity is low): the KL stays small and
# greedy picks mostly agree; the base perplexity is the fp16 set's own.
head -c 3000 /usr/share/common-licenses/Apache-2.0 >"$TMP/text.txt" 2>/dev/null || printf 'This License %.0s' $(seq 300) >"$TMP/text.txt"
"$POLLEN" perplexity "$TMP/llama-gqa-int4-tp1" --file "$TMP/text.txt" --ctx 64 --stride 32 --kl-base "$TMP/llama-gqa-tp1" \
  >"$TMP/ppl.txt" 2>&1
cat "$TMP/ppl.txt"
check "perplexity --kl-base: int4 vs fp16 mean KL below 0.05 nats" \
  awk '/^KL\(base/ { found = 1; ok = $5 + 0 > 0 && $5 + 0 < 0.05 } END { exit !(found && ok) }' "$TMP/ppl.txt"
check "perplexity --kl-base: top-1 agreement above 80 %" \
  awk '/^top-1 agreement/ { found = 1; v = $3; sub("%", "", v); ok = v + 0 > 80 } END { exit !(found && ok) }' "$TMP/ppl.txt"

# verify rebuilds every source tensor from the fused, split and replicated rank slices.
# bench's arithmetic for the family: llama-gqa (hidden 128, 8 q heads and 2 KV heads of 16,
# intermediate 256, 2 layers) at TP 1: qkv 192 x 128 + o 128 x 128 + gate_up 512 x 128 + down
# 128 x 256 = 139264 multiply-adds a layer per token, 2 x 8 x 16 a layer per attention key
out=$("$POLLEN" bench "$TMP/llama-gqa-tp1" --prompt-len 8 --batch 1 --steps 1 --context 4 --mbu off --json 2>/dev/null)
check "bench: the Llama family's multiply-adds per token and per key" \
  bash -c 'grep -q "\"layer_macs_per_token\":278528," <<<"$1" && grep -q "\"attn_macs_per_key\":512," <<<"$1"' _ "$out"
check "verify --source: fp16 TP 8 (KV heads replicated)" "$POLLEN" verify "$TMP/llama-gqa-tp8" --source "$M/llama-gqa/bf16-st"
check "verify --source: int8 g32 + int8 embedding and lm_head, TP 2" "$POLLEN" verify "$TMP/llama-gqa-int8-g32-emb-tp2" \
  --source "$M/llama-gqa/bf16-st"
check "verify --source: qwen2 q/k/v biases, TP 6" "$POLLEN" verify "$TMP/qwen2-bias-tp6" --source "$M/qwen2-bias/fp32-bin"
check "verify --source: int4, TP 2" "$POLLEN" verify "$TMP/llama-gqa-int4-tp2" --source "$M/llama-gqa/bf16-st"
# A source whose values differ from the set's is caught: one byte of the last shard changed.
cp -r "$M/llama-gqa/bf16-st" "$TMP/other-src"
f=$TMP/other-src/model-00006-of-00006.safetensors
printf '\x7f' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 2)) conv=notrunc status=none
check_fails "verify --source: a changed source value is found" "FAIL" "$POLLEN" verify "$TMP/llama-gqa-tp1" --source "$TMP/other-src"

# ... and so is a source whose config differs only where the weights cannot show it.
cp -r "$M/llama-gqa/bf16-st" "$TMP/theta-src"
sed -i 's/"rope_theta": 10000.0/"rope_theta": 20000.0/' "$TMP/theta-src/config.json"
check_fails "verify --source: a different rope_theta is named" "rope_theta=" "$POLLEN" verify "$TMP/llama-gqa-tp1" --source "$TMP/theta-src"

# The layout as docs/FORMAT.md specifies it: the stdlib reader and inspect agree.
if command -v python3 >/dev/null 2>&1; then
  for s in llama-gqa-tp4 llama-gqa-int8-g32-emb-tp2 qwen2-bias-tp2 llama-gqa-int4-tp2; do
    check "$s: the document's reader accepts the set and every checksum" python3 tests/tools/read_shard.py "$TMP/$s"
    "$POLLEN" inspect "$TMP/$s" --json >"$TMP/$s.inspect.json"
    check "$s: the document's reader and inspect agree on every tensor" python3 tests/tools/read_shard.py "$TMP/$s" \
      --against "$TMP/$s.inspect.json"
  done
fi
check "inspect: the layout and the fused tensors" bash -c "'$POLLEN' inspect '$TMP/llama-gqa-tp2' | grep -q 'layout llama-tp-v1' &&
  '$POLLEN' inspect '$TMP/llama-gqa-tp2' | grep -Eq 'model.layers.1.self_attn.qkv_proj.weight +F16 +\[96, 128\]'"

# serve under mpirun (TP 4: KV heads replicated): /generate's greedy tokens are generate's, and
# /info names the model's end id.
if command -v curl >/dev/null && command -v python3 >/dev/null; then
  CURL="curl -s --max-time 30"
  mpirun -np 4 "$POLLEN" generate "$TMP/llama-gqa-tp4" --prompt "This License" --max-new-tokens 8 --json --quiet >"$TMP/g.json" 2>/dev/null
  want=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["results"][0]["ids"])' "$TMP/g.json" 2>/dev/null)
  check "serve: starts (TP 4, mpirun)" start_server s mpirun -np 4 "$POLLEN" serve "$TMP/llama-gqa-tp4"
  got=$($CURL "http://127.0.0.1:$PORT/generate" -d '{"inputs":"This License","parameters":{"max_new_tokens":8,"details":true}}' |
        python3 -c 'import json,sys; print([t["id"] for t in json.load(sys.stdin)["details"]["tokens"]])' 2>/dev/null)
  echo "serve greedy ids $got, generate $want"
  check "serve: /generate greedy tokens equal generate's" test -n "$want" -a "$got" = "$want"
  check "serve: /info eos_token_id" bash -c "$CURL http://127.0.0.1:$PORT/info | grep -q '\"eos_token_id\": *2'"
  check "serve: clean exit" stop_server
fi

# synth writes a Llama-family checkpoint from the family's own tensor list (q/k/v and gate/up as
# their separate Hugging Face tensors), --layers rewriting num_hidden_layers; it converts, verifies
# and runs at TP 2 (1 KV head: replicated).
cat >"$TMP/tiny-qwen2.json" <<'JSON'
{"model_type": "qwen2", "vocab_size": 1003, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
 "num_attention_heads": 4, "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
 "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2}
JSON
check "synth: a qwen2 config, --layers 1" "$POLLEN" synth --model "$TMP/tiny-qwen2.json" -o "$TMP/sq" --layers 1 --quiet
check "synth: --layers rewrites num_hidden_layers" grep -q '"num_hidden_layers": 1' "$TMP/sq/config.json"
check "synth: q, k, v (with biases), gate and up as Hugging Face names them" bash -c "for t in q_proj.weight k_proj.bias v_proj.weight; do
  '$POLLEN' inspect '$TMP/sq' | grep -q \"model.layers.0.self_attn.\$t\" || exit 1; done; '$POLLEN' inspect '$TMP/sq' | grep -Eq 'model.layers.0.mlp.up_proj.weight +F16 +\[128, 64\]'"
check "synth: reshard --tp 2" "$POLLEN" reshard "$TMP/sq" -o "$TMP/sq2" --tp 2 --dtype fp16 --quiet
check "synth: verify --source" "$POLLEN" verify "$TMP/sq2" --source "$TMP/sq"
check "synth: generate at TP 2" mpirun -np 2 "$POLLEN" generate "$TMP/sq2" --token-ids 5,6,7 --max-new-tokens 3 --quiet
echo '{"model_type": "gpt2"}' >"$TMP/gpt2.json"
check_fails "synth: a model_type no family reads" "\"gpt2\" is not supported" "$POLLEN" synth --model "$TMP/gpt2.json" -o "$TMP/sx" --quiet

# End ids as a list (Llama 3.1's eos_token_id [128001, 128008, 128009]): generation ends on any of
# them. The set's first greedy token for "This License" is made the second end id of a copy.
"$POLLEN" generate "$TMP/llama-gqa-tp1" --prompt "This License" --max-new-tokens 4 --json --quiet >"$TMP/e0.json"
first=$(sed -n 's/.*[^_]"ids":\[\([0-9]*\).*/\1/p' "$TMP/e0.json")
rm -rf "$TMP/eos-src"; cp -r "$M/llama-gqa/bf16-st" "$TMP/eos-src"
sed -i "s/\"eos_token_id\": 2,/\"eos_token_id\": [1002, ${first:-0}],/" "$TMP/eos-src/config.json"
check "eos list: reshard" "$POLLEN" reshard "$TMP/eos-src" -o "$TMP/eos-set" --tp 2 --dtype fp16 --quiet
check "eos list: the manifest keeps every end id" grep -q "\"eos_token_ids\": \[" "$TMP/eos-set/manifest.json"
mpirun -np 2 "$POLLEN" generate "$TMP/eos-set" --prompt "This License" --max-new-tokens 4 --json --quiet >"$TMP/e1.json"
check "eos list: generation ends on the second end id ($first)" bash -c "test -n '$first' &&
  grep -q '[^_]\"ids\":\[$first\]' '$TMP/e1.json' && grep -q '\"finish_reason\":\"eos\"' '$TMP/e1.json'"
if command -v curl >/dev/null; then
  CURL="curl -s --max-time 30"
  check "eos list: serve starts (TP 2)" start_server e mpirun -np 2 "$POLLEN" serve "$TMP/eos-set"
  check "eos list: /generate ends with eos_token" bash -c "$CURL http://127.0.0.1:$PORT/generate \
    -d '{\"inputs\":\"This License\",\"parameters\":{\"max_new_tokens\":4,\"details\":true}}' |
    grep -q '\"finish_reason\": *\"eos_token\"'"
  check "eos list: /info names the first end id" bash -c "$CURL http://127.0.0.1:$PORT/info | grep -q '\"eos_token_id\": *1002'"
  check "eos list: serve exits cleanly" stop_server
fi

# Refusals, each naming what to change.
check_fails "reshard --tp 3 of 8 q heads lists the TP sizes that work" "TP sizes that work: 1, 2, 4, 8" \
  "$POLLEN" reshard "$M/llama-gqa/bf16-st" -o "$TMP/x3" --tp 3 --dtype fp16 --quiet
mk_src() { # mk_src NAME SED: a copy of llama3-tied's fp16 .bin dir with config.json edited
  rm -rf "$TMP/$1"; cp -r "$M/llama3-tied/fp16-bin" "$TMP/$1"; sed -i "$2" "$TMP/$1/config.json"
}
mk_src yarn 's/"rope_type": "llama3"/"rope_type": "yarn"/'
check_fails "rope_scaling yarn refused, naming the key" "\"rope_scaling\" has type \"yarn\"" \
  "$POLLEN" reshard "$TMP/yarn" -o "$TMP/x" --tp 1 --dtype fp16 --quiet
mk_src gptneox 's/"model_type": "llama"/"model_type": "gpt_neox"/'
check_fails "an unknown model_type refused, listing the known ones" "\"model_type\" is \"gpt_neox\".*\"llama\", \"mistral\", \"qwen2\"" \
  "$POLLEN" reshard "$TMP/gptneox" -o "$TMP/x" --tp 1 --dtype fp16 --quiet
mk_src mlpbias 's/"mlp_bias": false/"mlp_bias": true/'
check_fails "mlp_bias refused" "\"mlp_bias\" is true" "$POLLEN" reshard "$TMP/mlpbias" -o "$TMP/x" --tp 1 --dtype fp16 --quiet
rm -rf "$TMP/qwen2sw"; cp -r "$M/qwen2-bias/fp32-bin" "$TMP/qwen2sw"
sed -i 's/"use_sliding_window": false/"use_sliding_window": true/; s/"sliding_window": null/"sliding_window": 8/' "$TMP/qwen2sw/config.json"
check_fails "Qwen2's per-layer windows refused, naming the keys" "\"use_sliding_window\" is true.*\"max_window_layers\"" \
  "$POLLEN" reshard "$TMP/qwen2sw" -o "$TMP/x" --tp 1 --dtype fp16 --quiet

# Mistral's sliding window: the mistral-sw weights with config.json's sliding_window 8 (transformers'
# reference-f16-window8 on the same prompts; up to 19 prompt tokens and 20 generated ones, so the
# prefill and every decode step reach past the window) at every TP size the heads allow.
rm -rf "$TMP/sw"; cp -r "$M/mistral-sw/fp16-st" "$TMP/sw"; sed -i 's/"sliding_window": 4096/"sliding_window": 8/' "$TMP/sw/config.json"
REF=$M/mistral-sw/reference-f16-window8.safetensors
ids=$("$CMP" --print-ids "$REF")
for tp in 1 2 4; do
  check "sliding window 8 TP $tp: reshard" "$POLLEN" reshard "$TMP/sw" -o "$TMP/sw-tp$tp" --tp $tp --dtype fp16 --quiet
  # shellcheck disable=SC2086
  check "sliding window 8 TP $tp: generate" run_np $tp "$TMP/sw-tp$tp" $ids --max-new-tokens 20 --json --quiet \
    --dump-logits "$TMP/sw-tp$tp.st" >"$TMP/sw-tp$tp.json"
  check "sliding window 8 TP $tp: prefill logits vs transformers" "$CMP" --cmp-ref "$TMP/sw-tp$tp.st" "$REF" 1e-5
  check "sliding window 8 TP $tp: greedy ids and logprobs vs transformers" "$CMP" --cmp-greedy "$TMP/sw-tp$tp.json" "$REF" 1e-4
  [ $tp = 1 ] || check "sliding window 8 TP $tp: logits equal TP 1" "$CMP" --cmp-dump "$TMP/sw-tp$tp.st" "$TMP/sw-tp1.st" 1e-5
done
# ... and the full-context reference no longer matches: the window is what the numbers above test.
check_fails "sliding window 8: greedy differs from the full-context reference" "ids differ from transformers" \
  "$CMP" --cmp-greedy "$TMP/sw-tp1.json" "$M/mistral-sw/reference-f16.safetensors" 1e-4
e2e_done
