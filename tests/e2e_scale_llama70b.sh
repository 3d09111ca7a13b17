#!/usr/bin/env bash
# e2e_scale_llama70b.sh — the Llama family at Llama-3.1-70B widths (hidden 8192, 64 q heads and 8
# KV heads of 128, intermediate 28672, vocabulary 128256, untied head, llama3 rotary scaling), one
# layer: `synth --layers 1` (5.9 GB), reshard to TP 8 int8, verify every tensor against the source,
# and decode under mpirun -np 8. Opt-in (PLN_SCALE_CHECKS=1): it writes ~9 GB and takes minutes,
# past what `make test` may spend.
source "$(dirname "$0")/e2e.sh"
if [ "${PLN_SCALE_CHECKS:-0}" != 1 ] || ! command -v mpirun >/dev/null; then
  echo "SKIP: set PLN_SCALE_CHECKS=1 to run (needs mpirun and ~10 GB in \$PLN_TEST_TMP)"; e2e_done; exit 0
fi
export OMP_NUM_THREADS=1
SRC=$TMP/l70b-1l; SET=$TMP/l70b-1l-tp8-int8
check "synth llama-3.1-70b --layers 1" "$POLLEN" synth --model llama-3.1-70b --layers 1 -o "$SRC" --dtype bf16 --quiet
check "reshard --tp 8 --dtype int8" "$POLLEN" reshard "$SRC" -o "$SET" --tp 8 --dtype int8 --quiet
check "the set: 1280 q/k/v rows per rank (8 q heads, 1 k, 1 v of 128) and an untied lm_head slice" bash -c \
  "'$POLLEN' inspect '$SET' | grep -Eq '^3 +model.layers.0.self_attn.qkv_proj.weight +I8 +\[1280, 8192\]' &&
   '$POLLEN' inspect '$SET' | grep -Eq '^7 +lm_head.weight +F16 +\[16032, 8192\]'"
check "verify --source: every tensor of every rank" "$POLLEN" verify "$SET" --source "$SRC"
check "decode 8 tokens under mpirun -np 8" bash -c "mpirun -np 8 '$POLLEN' generate '$SET' --token-ids 128000,791,6864,315 \
  --max-new-tokens 8 --json --quiet >'$TMP/g.json' && grep -q '\"finish_reason\":\"length\"' '$TMP/g.json'"
rm -rf "$SRC" "$SET"
e2e_done
