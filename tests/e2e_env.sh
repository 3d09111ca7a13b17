#!/usr/bin/env bash
# e2e_env.sh — pollen's environment switches (formats/common.h ENV_NOTE): a value a switch does not
# take is refused with a message that names the variable and the values it takes, by every
# command that reads it (generate, serve, bench, perplexity, bench --copy-only, reshard, the CUDA
# backend on the CPU harness), never read as off; 0 and 1 work, and an empty value is the default.
source "$(dirname "$0")/e2e.sh"
export OMP_NUM_THREADS=1
F=tests/fixtures/models/bloom-4h/fp16-st
check "reshard int8 TP 1" "$POLLEN" reshard $F -o "$TMP/s" --tp 1 --dtype int8 --quiet

# ---- every CPU-side 0/1 switch, and PLN_GRAPHS (read by the model for every backend) ----------
for var in PLN_CPU_INT_DOT PLN_CPU_BATCH_INVARIANT PLN_CPU_NO_VNNI PLN_GRAPHS; do
  for bad in on true yes 2 " 1"; do
    check_fails "$var='$bad': refused, naming the variable and its values" "$var=$bad: expected 0 or 1" \
      env "$var=$bad" "$POLLEN" generate "$TMP/s" --token-ids 5,17,42 --max-new-tokens 2 --quiet
  done
  for good in 0 1 ""; do
    check "$var='$good': runs" env "$var=$good" "$POLLEN" generate "$TMP/s" --token-ids 5,17,42 --max-new-tokens 2 --quiet
  done
done
# the switch reaches the kernels: PLN_CPU_INT_DOT=1 changes the int8 prefill's logits (35 tokens:
# the integer dots), =0 is the default's
"$POLLEN" generate "$TMP/s" --token-ids "$(seq -s, 5 39)" --max-new-tokens 1 --quiet --dump-logits "$TMP/d.st"
PLN_CPU_INT_DOT=0 "$POLLEN" generate "$TMP/s" --token-ids "$(seq -s, 5 39)" --max-new-tokens 1 --quiet \
  --dump-logits "$TMP/d0.st"
PLN_CPU_INT_DOT=1 "$POLLEN" generate "$TMP/s" --token-ids "$(seq -s, 5 39)" --max-new-tokens 1 --quiet \
  --dump-logits "$TMP/d1.st"
check "PLN_CPU_INT_DOT=0: the default's logits" cmp "$TMP/d.st" "$TMP/d0.st"
check "PLN_CPU_INT_DOT=1: other logits (the integer dots ran)" bash -c '! cmp -s "$1" "$2"' _ "$TMP/d.st" "$TMP/d1.st"

# ---- PLN_CPU_ISA names a tier ------------------------------------------------------------------
for bad in avx512f AVX2 sse4 x; do
  check_fails "PLN_CPU_ISA=$bad: refused by generate" "PLN_CPU_ISA=$bad: expected one of ref, c, avx2, avx512" \
    env "PLN_CPU_ISA=$bad" "$POLLEN" generate "$TMP/s" --token-ids 5,17,42 --max-new-tokens 2 --quiet
  check_fails "PLN_CPU_ISA=$bad: refused by bench --copy-only (no backend)" "PLN_CPU_ISA=$bad: expected one of" \
    env "PLN_CPU_ISA=$bad" "$POLLEN" bench --copy-only --threads 1 --stream-mib 8
done
check_fails "PLN_CPU_INT_DOT=on: refused by bench --copy-only" "PLN_CPU_INT_DOT=on: expected 0 or 1" \
  env PLN_CPU_INT_DOT=on "$POLLEN" bench --copy-only --threads 1 --stream-mib 8
check "PLN_CPU_ISA=c: runs" env PLN_CPU_ISA=c "$POLLEN" generate "$TMP/s" --token-ids 5,17,42 --max-new-tokens 2 --quiet

# ---- the other commands that build a backend ---------------------------------------------------
check_fails "bench: PLN_CPU_BATCH_INVARIANT=yes refused" "PLN_CPU_BATCH_INVARIANT=yes: expected 0 or 1" \
  env PLN_CPU_BATCH_INVARIANT=yes "$POLLEN" bench "$TMP/s" --prompt-len 8 --batch 1 --steps 1 --mbu off --threads 1
printf 'In the beginning was the word, and the word was with the text.\n' >"$TMP/t.txt"
check_fails "perplexity: PLN_GRAPHS=off refused" "PLN_GRAPHS=off: expected 0 or 1" \
  env PLN_GRAPHS=off "$POLLEN" perplexity "$TMP/s" --file "$TMP/t.txt" --quiet
check_fails "serve: PLN_CPU_INT_DOT=true refused before it listens" "PLN_CPU_INT_DOT=true: expected 0 or 1" \
  env PLN_CPU_INT_DOT=true timeout 60 "$POLLEN" serve "$TMP/s" --port 0

# ---- reshard's --------------------------------------------------------------------------------
check_fails "reshard: PLN_WRITE_DIRECT=on refused" "PLN_WRITE_DIRECT=on: expected 0 or 1" \
  env PLN_WRITE_DIRECT=on "$POLLEN" reshard $F -o "$TMP/r0" --tp 1 --dtype fp16 --quiet
check "reshard: PLN_WRITE_DIRECT=on left no output" test ! -e "$TMP/r0"
check_fails "reshard: PLN_RESHARD_TIMING=yes refused" "PLN_RESHARD_TIMING=yes: expected 0 or 1" \
  env PLN_RESHARD_TIMING=yes "$POLLEN" reshard $F -o "$TMP/r1" --tp 1 --dtype fp16 --quiet
check "reshard: PLN_RESHARD_TIMING=yes left no output" test ! -e "$TMP/r1"
out=$(PLN_RESHARD_TIMING=1 "$POLLEN" reshard $F -o "$TMP/r2" --tp 1 --dtype fp16 --quiet 2>&1)
check "reshard: PLN_RESHARD_TIMING=1 prints where the time went" grep -q '^timing: open+plan' <<<"$out"

# ---- the CUDA backend's switches, on the CPU execution harness (build/emu/pollen, where built) --
EMU=${PLN_BUILD:-build}/emu/pollen
if [ -x "$EMU" ]; then
  for var in PLN_PDL PLN_CUDA_LN_SPLIT PLN_CUDA_PREFILL_TILED PLN_CUDA_NO_GELU_EPILOGUE; do
    check_fails "cuda backend (harness): $var=on refused" "$var=on: expected 0 or 1" \
      env "$var=on" "$EMU" generate "$TMP/s" --backend cuda --token-ids 5,17,42 --max-new-tokens 2 --quiet
  done
  check_fails "cuda backend (harness): PLN_CUDA_ATTN_SPLITS=four refused" \
    "PLN_CUDA_ATTN_SPLITS=four: expected a whole number from -1 to 1024" \
    env PLN_CUDA_ATTN_SPLITS=four "$EMU" generate "$TMP/s" --backend cuda --token-ids 5,17,42 --max-new-tokens 2 --quiet
  check "cuda backend (harness): PLN_PDL=0 PLN_CUDA_ATTN_SPLITS=2 run" env PLN_PDL=0 PLN_CUDA_ATTN_SPLITS=2 \
    "$EMU" generate "$TMP/s" --backend cuda --token-ids 5,17,42 --max-new-tokens 2 --quiet
else
  echo "note: no $EMU; the CUDA backend's switches are checked where the harness is built"
fi
e2e_done
