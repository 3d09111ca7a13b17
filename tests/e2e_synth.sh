# e2e_synth.sh — `pollen synth`: a random HF-layout BLOOM checkpoint our readers accept and
# reshard converts; deterministic per seed; sharded with an index; refuses an existing OUT.
source "$(dirname "$0")/e2e.sh"

cat > $TMP/tiny.json <<'EOF'
{"model_type": "bloom", "hidden_size": 64, "n_head": 4, "n_layer": 3, "vocab_size": 1003,
 "layer_norm_epsilon": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
 "apply_residual_connection_post_layernorm": false}
EOF
check "synth from a config.json" "$POLLEN" synth --model $TMP/tiny.json -o $TMP/a --seed 7 --shard-size 60000 --quiet
check "sharded: several safetensors files" test "$(ls $TMP/a/model-0000*-of-0000*.safetensors | wc -l)" -ge 3
check "index names every tensor (3 layers x 12 + 5)" \
  test "$(grep -c '"transformer\.' $TMP/a/model.safetensors.index.json)" = 41
check "tokenizer.json carried" cmp -s $TMP/a/tokenizer.json tests/fixtures/tokenizer/tokenizer.json
check "config keeps the model's values" grep -q '"vocab_size": 1003' $TMP/a/config.json
"$POLLEN" synth --model $TMP/tiny.json -o $TMP/b --seed 7 --shard-size 60000 --quiet
check "same seed: byte-identical" diff -r $TMP/a $TMP/b
"$POLLEN" synth --model $TMP/tiny.json -o $TMP/c --seed 8 --shard-size 60000 --quiet
check "other seed: different weights" bash -c "! cmp -s $TMP/a/model-00001-of-0000*.safetensors $TMP/c/model-00001-of-0000*.safetensors"
check "--layers 1 --dtype bf16 single file" "$POLLEN" synth --model $TMP/tiny.json -o $TMP/d --layers 1 --dtype bf16 --quiet
check "single file is model.safetensors, no index" test -f $TMP/d/model.safetensors -a ! -f $TMP/d/model.safetensors.index.json
check "--layers rewrites n_layer" grep -q '"n_layer": 1' $TMP/d/config.json
check "bf16 recorded" grep -q '"torch_dtype": "bfloat16"' $TMP/d/config.json
for dt in fp16 int8; do
  check "synth checkpoint reshards ($dt)" "$POLLEN" reshard $TMP/a -o $TMP/a-$dt --tp 2 --dtype $dt --quiet
  check "and verifies against it ($dt)" "$POLLEN" verify $TMP/a-$dt --source $TMP/a
done
check "bf16 synth reshards TP 4 and verifies" \
  bash -c "'$POLLEN' reshard $TMP/d -o $TMP/d4 --tp 4 --dtype fp16 --quiet && '$POLLEN' verify $TMP/d4 --source $TMP/d >/dev/null"
check_fails "existing OUT refused" "not empty \(holds .*\); pass --force" "$POLLEN" synth --model $TMP/tiny.json -o $TMP/a --quiet
check "--force replaces it" "$POLLEN" synth --model $TMP/tiny.json -o $TMP/a --force --quiet --seed 8 --shard-size 60000
check "replaced content is seed 8's" diff -r $TMP/a $TMP/c
check_fails "unknown model named" "bloom-9b.*not a known model" "$POLLEN" synth --model bloom-9b -o $TMP/x
check_fails "a config that is not BLOOM" "hidden_size|n_head|n_embed" \
  bash -c "echo '{\"model_type\": \"bloom\", \"vocab_size\": 10}' > $TMP/bad.json; '$POLLEN' synth --model $TMP/bad.json -o $TMP/x"
check "nothing left by failures" test ! -e $TMP/x
e2e_done
