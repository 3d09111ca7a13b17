#!/usr/bin/env bash
# e2e_generate.sh — `pollen generate` under mpirun at TP 1/2/4 (bloom-4h) and 1/2/3 (bloom-6h) on
# fp16 shards made by `pollen reshard` from the transformers fixtures: prefill logits of a batch of
# four prompts of different lengths within 1e-3 of transformers, the 20-step greedy continuations
# and their log-probs identical, TP>1 logits equal to TP 1 within 1e-5 (every prefill and decode
# row), int8 at TP 2 (per channel; and grouped with an int8 embedding) and int4 at TP 1/2/3 (and with an int8
# embedding; every TP size the same) within the bound derived from its recorded quantization error, and a clear
# error when the rank count does not match the set, a bad option value, or --backend cuda without a GPU.
source "$(dirname "$0")/e2e.sh"
CMP=${PLN_BUILD:-build}/tests/test_engine
if ! "$POLLEN" reshard --help >/dev/null 2>&1 || ! command -v mpirun >/dev/null || [ ! -x "$CMP" ]; then
  echo "SKIP: needs pollen reshard, mpirun and $CMP"; e2e_done; exit 0
fi
export OMP_NUM_THREADS=1
run_np() { # run_np N args...: generate under mpirun (N = 1 runs without a launcher)
  local n=$1; shift
  if [ "$n" = 1 ]; then "$POLLEN" generate "$@"; else mpirun -np "$n" "$POLLEN" generate "$@"; fi
}
check_tp_fidelity run_np "" 1e-3 2e-3 1e-5 "bloom-4h fp16-st 1 2 4" "bloom-6h fp16-bin 1 2 3"
# int8 at TP 2 vs fp16 at TP 1 (prefill rows: one new token each).
ids=$("$CMP" --print-ids tests/fixtures/models/bloom-4h/reference-f16.safetensors)
check "int8: reshard --tp 2" "$POLLEN" reshard tests/fixtures/models/bloom-4h/fp16-st -o "$TMP/i8" --tp 2 --dtype int8 --quiet
# shellcheck disable=SC2086
check "int8 TP 2: generate" run_np 2 "$TMP/i8" $ids --max-new-tokens 1 --quiet --dump-logits "$TMP/i8.st"
# shellcheck disable=SC2086
check "fp16 TP 1: generate" run_np 1 "$TMP/bloom-4h-tp1" $ids --max-new-tokens 1 --quiet --dump-logits "$TMP/f16.st"
check "int8 TP 2 within the quantization bound" "$CMP" --cmp-int8 "$TMP/i8.st" "$TMP/f16.st" "$TMP/i8"
# Grouped scales and an int8 embedding (looked up on the host, tied lm head in int8).
check "int8 g16+emb: reshard" "$POLLEN" reshard tests/fixtures/models/bloom-4h/fp16-st -o "$TMP/i8g" --tp 2 --dtype int8 \
  --group-size 16 --quantize-embedding --quiet
# shellcheck disable=SC2086
check "int8 g16+emb TP 2: generate" run_np 2 "$TMP/i8g" $ids --max-new-tokens 1 --quiet --dump-logits "$TMP/i8g.st"
check "int8 g16+emb TP 2 within the quantization bound" "$CMP" --cmp-int8 "$TMP/i8g.st" "$TMP/f16.st" "$TMP/i8g"
# int4 (groups of 32; groups never straddle a rank's slice, so every TP size holds the same
# weights): bloom-4h at TP 1 and 2, bloom-6h (hidden 96) at TP 1 and 3, each within the bound of
# the recorded error, and TP > 1 equal to TP 1 within 1e-5 (only the reduction order differs);
# then with an int8 embedding.
for spec in "bloom-4h fp16-st 2" "bloom-6h fp16-bin 3"; do
  read -r model src tpn <<<"$spec"
  mids=$("$CMP" --print-ids "tests/fixtures/models/$model/reference-f16.safetensors")
  # shellcheck disable=SC2086
  check "$model fp16 TP 1: generate" run_np 1 "$TMP/$model-tp1" $mids --max-new-tokens 1 --quiet --dump-logits "$TMP/$model-f16.st"
  for tp in 1 $tpn; do
    check "$model int4 g32: reshard --tp $tp" "$POLLEN" reshard "tests/fixtures/models/$model/$src" -o "$TMP/$model-i4-$tp" --tp $tp \
      --dtype int4 --group-size 32 --quiet
    # shellcheck disable=SC2086
    check "$model int4 g32 TP $tp: generate" run_np $tp "$TMP/$model-i4-$tp" $mids --max-new-tokens 1 --quiet --dump-logits "$TMP/$model-i4-$tp.st"
    check "$model int4 g32 TP $tp within the quantization bound" "$CMP" --cmp-int8 "$TMP/$model-i4-$tp.st" "$TMP/$model-f16.st" "$TMP/$model-i4-$tp"
  done
  check "$model int4 TP $tpn = TP 1" "$CMP" --cmp-dump "$TMP/$model-i4-$tpn.st" "$TMP/$model-i4-1.st" 1e-5
done
# The integer-dot path (activations rounded to int8 per block of 32; int8 sets in steps of 12+
# tokens on AVX-512, 9+ on AVX2 (kernels/cpu/cpu.h Q8_MIN_NOTE), here the prefill of the four
# prompts, 35 tokens; int4 sets at every step) on int8 per channel at TP 2 (PLN_CPU_INT_DOT=1:
# the backend's default when no --int-dot is given) and int4 g32 at TP 1 (--int-dot on): it must
# change the logits (it ran), stay within 2e-2 of the float path (--int-dot off) on the same set,
# and within the set's bound against fp16. --int-dot auto, the default, is on for int4 (the
# unflagged int4 run above is the --int-dot on one, bit for bit) and off for int8.
# shellcheck disable=SC2086
check "int8 TP 2 integer-dot: generate" env PLN_CPU_INT_DOT=1 mpirun -np 2 "$POLLEN" generate "$TMP/i8" $ids --max-new-tokens 1 \
  --quiet --dump-logits "$TMP/i8-idot.st"
# shellcheck disable=SC2086
check "int4 TP 1 integer-dot: generate" "$POLLEN" generate "$TMP/bloom-4h-i4-1" $ids --max-new-tokens 1 --int-dot on --quiet --dump-logits "$TMP/i4-idot.st"
# shellcheck disable=SC2086
check "int4 TP 1 float path: generate" "$POLLEN" generate "$TMP/bloom-4h-i4-1" $ids --max-new-tokens 1 --int-dot off --quiet --dump-logits "$TMP/i4-float.st"
check "int4: --int-dot auto (the default) is on" cmp "$TMP/i4-idot.st" "$TMP/bloom-4h-i4-1.st"
for pair in "i8-idot i8 i8" "i4-idot i4-float bloom-4h-i4-1"; do
  read -r got base set <<<"$pair"
  d=$("$CMP" --cmp-dump "$TMP/$got.st" "$TMP/$base.st" 2e-2 | grep -o 'rel L2 [0-9.e+-]*' | awk '{print $3}')
  echo "integer-dot $got vs the float path: logits rel L2 ${d:-?}"
  check "$got: within 2e-2 of the float path and not identical to it" awk -v d="${d:-1}" 'BEGIN{exit !(d > 0 && d <= 2e-2)}'
  check "$got: within the quantization bound against fp16" "$CMP" --cmp-int8 "$TMP/$got.st" "$TMP/bloom-4h-f16.st" "$TMP/$set"
done
# A step of 8 int8 tokens (fewer than the AVX2 and AVX-512 tiers' minimum; the portable C tier
# takes the integer dots from 2) stays on the float path, bit for bit.
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  for idot in on off; do
    check "int8 TP 2, --int-dot $idot, one prompt of 8 tokens: generate" mpirun -np 2 "$POLLEN" generate "$TMP/i8" \
      --token-ids 692,72,888,739,284,775,81,308 --max-new-tokens 1 --int-dot $idot --quiet --dump-logits "$TMP/i8-8-$idot.st"
  done
  check "int8, --int-dot on, a step of 8 tokens: the float path's logits, bit for bit" cmp "$TMP/i8-8-on.st" "$TMP/i8-8-off.st"
fi
# shellcheck disable=SC2086
check_fails "--int-dot: a value that is not on/off/auto" "is not one of on, off, auto" "$POLLEN" generate "$TMP/i8" $ids \
  --max-new-tokens 1 --int-dot yes --quiet
# shellcheck disable=SC2086
check_fails "--int-dot on: refused on the cuda backend" "the integer-dot path is the cpu backend's" "$POLLEN" generate \
  "$TMP/i8" $ids --max-new-tokens 1 --int-dot on --backend cuda --quiet
# shellcheck disable=SC2086
check_fails "--batch-invariant: refused on the cuda backend" "the batch-invariant mode is the cpu backend's" \
  "$POLLEN" generate "$TMP/i8" $ids --max-new-tokens 1 --batch-invariant --backend cuda --quiet
# the four prompts (35 tokens) prefill as one step of more tokens than the batched float path
# starts at (below: where it has one): with the flag they take the tiles instead, the same values
# within fp32 rounding but not the same bits
# shellcheck disable=SC2086
check "--batch-invariant: generate" run_np 2 "$TMP/i8" $ids --max-new-tokens 1 --batch-invariant --quiet \
  --dump-logits "$TMP/i8-bi.st"
check "--batch-invariant: the logits within 1e-5 of the default's" "$CMP" --cmp-dump "$TMP/i8-bi.st" "$TMP/i8.st" 1e-5
# only a tier with a batched float path (gemm_panel: AVX2 and AVX-512) runs the default prefill
# differently from the tiles; on the others (c, ref) both are the tiles and the bits agree. The
# path starts at 32 tokens (cpu.h pln_cpu_panel_min), so the 35-token prefills of both the
# per-channel and the grouped (int8 g16) set take it.
isa=$("$POLLEN" bench --copy-only --threads 1 --stream-mib 8 --json 2>/dev/null | grep -o '"cpu_isa":"[a-z0-9]*"' | cut -d'"' -f4)
check "bench --copy-only names the CPU kernels' tier" grep -Eq '^(ref|c|avx2|avx512)$' <<<"$isa"
# shellcheck disable=SC2086
check "--batch-invariant: generate (int8 g16)" run_np 2 "$TMP/i8g" $ids --max-new-tokens 1 --batch-invariant --quiet \
  --dump-logits "$TMP/i8g-bi.st"
check "--batch-invariant (int8 g16): the logits within 1e-5 of the default's" "$CMP" --cmp-dump "$TMP/i8g-bi.st" "$TMP/i8g.st" 1e-5
if [ "$isa" = avx512 ] || [ "$isa" = avx2 ]; then
  check "--batch-invariant (int8 g16): took the tiles (the logits are not the default's bits)" \
    sh -c '! cmp -s "$1" "$2"' _ "$TMP/i8g-bi.st" "$TMP/i8g.st"
else
  check "--batch-invariant (int8 g16) on the $isa tier (no batched float path): the default's bits" cmp "$TMP/i8g-bi.st" "$TMP/i8g.st"
fi
if [ "$isa" = avx512 ] || [ "$isa" = avx2 ]; then
  check "--batch-invariant: took the tiles (the logits are not the default's bits)" sh -c '! cmp -s "$1" "$2"' _ "$TMP/i8-bi.st" "$TMP/i8.st"
else
  check "--batch-invariant on the $isa tier (no batched float path): the default's bits" cmp "$TMP/i8-bi.st" "$TMP/i8.st"
fi
check "int4 g32+emb: reshard" "$POLLEN" reshard tests/fixtures/models/bloom-4h/fp16-st -o "$TMP/i4e" --tp 2 --dtype int4 \
  --group-size 32 --quantize-embedding --quiet
# shellcheck disable=SC2086
check "int4 g32+emb TP 2: generate" run_np 2 "$TMP/i4e" $ids --max-new-tokens 1 --quiet --dump-logits "$TMP/i4e.st"
check "int4 g32+emb TP 2 within the quantization bound" "$CMP" --cmp-int8 "$TMP/i4e.st" "$TMP/f16.st" "$TMP/i4e"
check_fails "int4: a group size the packed layout cannot hold" "int4 needs 32, 64 or 128" "$POLLEN" reshard \
  tests/fixtures/models/bloom-4h/fp16-st -o "$TMP/i4bad" --tp 1 --dtype int4 --group-size 16
# Seeded sampling (temperature, top-k, top-p, repetition penalty) gives the same tokens at every TP.
samp="--temperature 1.3 --top-k 40 --top-p 0.9 --repetition-penalty 1.2 --seed 7 --max-new-tokens 12 --json --quiet"
# shellcheck disable=SC2086
for tp in 1 2 4; do run_np $tp "$TMP/bloom-4h-tp$tp" $ids $samp | grep -o '"ids":\[[0-9,]*\]' >"$TMP/samp$tp.txt"; done
check "sampled ids are non-trivial" test "$(wc -l <"$TMP/samp1.txt")" = 4
check "same seed, same tokens at TP 2" cmp -s "$TMP/samp1.txt" "$TMP/samp2.txt"
check "same seed, same tokens at TP 4" cmp -s "$TMP/samp1.txt" "$TMP/samp4.txt"
# Stop strings end a sequence with finish_reason "stop" and the text cut before the match.
out=$("$POLLEN" generate "$TMP/bloom-4h-tp1" --prompt "Hello world" --max-new-tokens 8 --stop "world world" --json --quiet)
check "stop string" grep -q '"text":" ","finish_reason":"stop"' <<<"$out"
# Text prompts through the tokenizer, streaming, and a wrong rank count.
out=$(mpirun -np 2 "$POLLEN" generate "$TMP/bloom-4h-tp2" --prompt "Hello world" --max-new-tokens 5 2>/dev/null)
check "text prompt streams the prompt and continuation" test "${out#Hello world}" != "$out"
check_fails "rank count must equal TP" "TP=2 but 3 ranks" mpirun -np 3 "$POLLEN" generate "$TMP/bloom-4h-tp2" --prompt hi
out=$(mpirun -np 2 "$POLLEN" bench "$TMP/bloom-4h-tp2" --prompt-len 8 --batch 1,2 --steps 2 --context 4 --stream-mib 8 --json 2>/dev/null)
check_fails "bench --steps 0 is refused, naming the option" "steps.*0" "$POLLEN" bench "$TMP/bloom-4h-tp1" --steps 0
check_fails "bench --prompt-len 12abc is refused" "prompt-len.*12abc" "$POLLEN" bench "$TMP/bloom-4h-tp1" --prompt-len 12abc
check_fails "bench --device -1 is refused" "device" "$POLLEN" bench "$TMP/bloom-4h-tp1" --device -1
check "bench under mpirun reports decode figures and MBU" grep -q '"batch":2,"ms_per_step":[0-9.e-]*,"ms_per_token":[0-9.e-]*,"tokens_per_s":[0-9.e+-]*,"mbu"' <<<"$out"
check "bench under mpirun: MBU against the start-up copy" grep -q '"mbu_mode":"start"' <<<"$out"
# TP 1: each step beside its own copy; MBU is their median, so it lies between the extremes
out1=$("$POLLEN" bench "$TMP/bloom-4h-tp1" --prompt-len 8 --batch 1,2 --steps 3 --context 4 --stream-mib 8 --json 2>/dev/null)
mbu_ordered() { # every decode entry: 0 < mbu_min <= mbu <= mbu_max and copy_gbs > 0
  grep -o '"batch":[^}]*' <<<"$1" | awk -F'[,:]' '
    { for (i = 1; i < NF; i += 2) v[$i] = $(i + 1)
      if (!(v["\"mbu_min\""] > 0 && v["\"mbu_min\""] <= v["\"mbu\""] && v["\"mbu\""] <= v["\"mbu_max\""] && v["\"copy_gbs\""] > 0)) bad = 1; n++ }
    END { exit bad || n != 2 }'
}
check "bench at TP 1 reports MBU as the median of steps beside their own copies" mbu_ordered "$out1"
check_fails "the MBU order check can fail" "" mbu_ordered "${out1//\"mbu_max\"/\"mbu_maxx\"}"
out0=$("$POLLEN" bench "$TMP/bloom-4h-tp1" --prompt-len 8 --batch 1 --steps 2 --context 4 --mbu off --json 2>/dev/null)
check "bench --mbu off: decode figures, no copy and no MBU" grep -q '"tokens_per_s":[0-9.e+-]*,"mbu":null.*"stream_copy_gbs":null,"mbu_mode":"off"' <<<"$out0"
check "bench at TP 1 says its MBU is per step" grep -q '"mbu_mode":"steps"' <<<"$out1"
# The arithmetic behind the GFLOP/s figures, bloom-4h (hidden 64, 4 heads, 2 layers): per token
# 12 x 64^2 multiply-adds a layer, per attention key 2 x 64 a layer (q.k and p.v), per logits row
# the vocabulary slice x 64; each rank its share. An 8-token prefill reads 1 + ... + 8 = 36 keys:
# prefill_gops x 8 / tokens_per_s = 2 (8 x 98304 + 36 x 256 + lm) / 1e9 (within the 6 digits --json prints).
jnum() { grep -o "\"$1\":[-0-9.e+]*" <<<"$2" | head -n 1 | cut -d: -f2; }
flops_ok() { # OUT LAYER ATTN: the counts, and the prefill rate made of them
  [ "$(jnum layer_macs_per_token "$1")" = "$2" ] && [ "$(jnum attn_macs_per_key "$1")" = "$3" ] &&
    awk -v g="$(jnum prefill_gops "$1")" -v t="$(jnum prefill_tokens_per_s "$1")" -v l="$2" -v a="$3" \
      -v lm="$(jnum lm_macs_per_row "$1")" -v tp="$4" \
      'BEGIN { f = 2 * tp * (8 * l + 36 * a + lm); r = g * 1e9 * 8 / t; exit !(lm >= 1003 * 64 / tp && r > 0.99998 * f && r < 1.00002 * f) }'
}
check "bench --json: the multiply-adds per token, per key and per row, and the prefill GFLOP/s made of them" flops_ok "$out0" 98304 256 1
check_fails "the FLOP check can fail" "" flops_ok "$out0" 98304 128 1
check "bench under mpirun: each rank's share of the multiply-adds at TP 2" flops_ok "$out" 49152 128 2
check "bench: the FMA peak measured at TP 1 on the CPU" grep -Eq '"fma_peak_gflops":[0-9.e+]*[1-9]' <<<"$out0"
check "bench under mpirun: no FMA peak (the ranks share the cores)" grep -q '"fma_peak_gflops":null' <<<"$out"
check "bench: each decode batch's GOP/s" bash -c '[ "$(grep -Eo "\"gops\":[0-9.e+]*[1-9]" <<<"$1" | wc -l)" = 2 ]' _ "$out1"
txt=$("$POLLEN" bench "$TMP/bloom-4h-tp1" --prompt-len 8 --batch 2 --steps 2 --context 4 --mbu off 2>/dev/null)
check "bench prints the prefill GFLOP/s beside the FMA peak" grep -Eq '^prefill 8 tokens: .* tokens/s, [0-9.]+ GFLOP/s \([0-9]+% of the FMA peak, [0-9]+ GFLOP/s\)$' <<<"$txt"
check "bench prints each decode batch's GFLOP/s and its share of the peak" grep -Eq '^decode batch   2: .*, MBU    n/a, [0-9.]+ GFLOP/s = [0-9]+% of FMA \(' <<<"$txt"
outs=$("$POLLEN" bench "$TMP/bloom-4h-tp1" --prompt-len 8 --batch 1,2 --steps 2 --context 4 --stream-mib 8 --mbu start --json 2>/dev/null)
check "bench --mbu start: MBU against the start-up copy" mbu_ordered "$outs"
# The host CPU beside the figures: non-empty vendor and name, family/model/stepping, and the SIMD
# tier the CPU kernels run (PLN_CPU_ISA lowers it), in --json and on stderr in text mode.
cpu_fields() { # every cpu_* field present, strings non-empty, numbers integers
  grep -q '"cpu_name":"[^"]\{1,\}"' <<<"$1" && grep -q '"cpu_vendor":"[^"]\{1,\}"' <<<"$1" &&
    grep -q '"cpu_family":-\{0,1\}[0-9]\{1,\}' <<<"$1" && grep -q '"cpu_model":-\{0,1\}[0-9]\{1,\}' <<<"$1" &&
    grep -q '"cpu_stepping":-\{0,1\}[0-9]\{1,\}' <<<"$1" && grep -Eq '"cpu_isa":"(ref|c|avx2|avx512)"' <<<"$1"
}
check "bench --json names the CPU and its SIMD tier" cpu_fields "$out0"
check_fails "the CPU field check can fail" "" cpu_fields "$(sed 's/"cpu_vendor":"[^"]*"/"cpu_vendor":""/' <<<"$out0")"
check_fails "the CPU field check can fail on a missing field" "" cpu_fields "${out0//cpu_isa/cpu_simd}"
err=$("$POLLEN" bench "$TMP/bloom-4h-tp1" --prompt-len 8 --batch 1 --steps 1 --context 4 --mbu off 2>&1 >/dev/null)
check "bench prints the CPU line on stderr" grep -Eq '^cpu: [^ ].* \([^ ,]+, family -?[0-9]+ model -?[0-9]+ stepping -?[0-9]+\); CPU kernels: (ref|c|avx2|avx512)$' <<<"$err"
outc=$(PLN_CPU_ISA=c "$POLLEN" bench --copy-only --threads 1 --stream-mib 8 --json 2>/dev/null)
check "bench --copy-only: a positive copy bandwidth and FMA peak on the threads asked for" grep -Eq '^\{"stream_copy_gbs":[0-9.e+]*[1-9][0-9.e+]*,"fma_peak_gflops":[0-9.e+]*[1-9][0-9.e+]*,"core_to_core_ns":([0-9.e+]*[1-9][0-9.e+]*|null),"threads":1,"stream_mib":8,' <<<"$outc"
if [ "$(getconf _NPROCESSORS_ONLN)" -ge 2 ]; then
  check "bench --copy-only: a positive core-to-core latency between two CPUs" grep -Eq '"core_to_core_ns":[0-9.e+]*[1-9][0-9.e+]*,' <<<"$outc"
fi
if command -v taskset >/dev/null; then
  out1=$(taskset -c "$(cut -d, -f1 <<<"$(taskset -pc $$ | sed 's/.*: //' | cut -d- -f1)")" "$POLLEN" bench --copy-only --threads 1 --stream-mib 8 2>/dev/null)
  check "bench --copy-only on one CPU: the core-to-core line says n/a" grep -q "^core to core: n/a (fewer than two CPUs allowed, or the two threads could not run pinned)$" <<<"$out1"
  check "bench --copy-only on one CPU: still the copy and the FMA peak" grep -q "^FMA peak: " <<<"$out1"
fi
outr=$(PLN_CPU_ISA=ref "$POLLEN" bench --copy-only --threads 1 --stream-mib 8 --json 2>/dev/null)
check "bench --copy-only with the reference loops: a positive FMA peak" grep -Eq '"fma_peak_gflops":[0-9.e+]*[1-9][0-9.e+]*,.*"cpu_isa":"ref"' <<<"$outr"
outh=$("$POLLEN" bench --copy-only --threads 1 --stream-mib 8 2>/dev/null)
check "bench --copy-only prints both ceilings, the FMA peak naming the kernels' tier" bash -c 'grep -Eq "^STREAM copy: [0-9.]+ GB/s \(1 threads, 8 MiB arrays" <<<"$1" && grep -Eq "^FMA peak: [0-9]*[1-9][0-9]*\.[0-9] GFLOP/s \(1 threads, fp32 multiply-adds, (ref|c|avx2|avx512) kernels\)$" <<<"$1"' _ "$outh"
check "bench --copy-only names the CPU; PLN_CPU_ISA=c lowers the tier it reports" bash -c 'grep -q "\"cpu_isa\":\"c\"" <<<"$1"' _ "$outc"
check_fails "bench --copy-only takes no set" "copy-only takes no SET" "$POLLEN" bench "$TMP/bloom-4h-tp1" --copy-only
check_fails "bench --mbu with an unknown mode is refused, naming it" 'mbu.*"sometimes".*steps, start or off' "$POLLEN" bench "$TMP/bloom-4h-tp1" --mbu sometimes
check_fails "missing set" "manifest.json" "$POLLEN" generate "$TMP/nonexistent" --prompt hi
# Option values are checked whole and against their range; the message names the option and value.
set1=$TMP/bloom-4h-tp1
bad_value() { # bad_value "expected stderr regex" args...: generate refuses the values
  local re=$1; shift
  check_fails "generate $*" "$re" "$POLLEN" generate "$set1" --prompt hi --quiet "$@"
}
bad_value 'pollen: --max-new-tokens "abc": not an integer' --max-new-tokens abc
bad_value 'pollen: --max-new-tokens 0: out of range' --max-new-tokens 0
bad_value 'pollen: --max-new-tokens "12x": not an integer' --max-new-tokens 12x
bad_value 'pollen: --top-k "x": not an integer' --top-k x
bad_value 'pollen: --top-k -1: out of range' --top-k -1
bad_value 'pollen: --top-p 0: out of range .*\(0, 1\]' --top-p 0
bad_value 'pollen: --top-p 1.5: out of range' --top-p 1.5
bad_value 'pollen: --temperature -1: out of range .*\[0, inf\)' --temperature -1
bad_value 'pollen: --temperature "nan": not a finite number' --temperature nan
bad_value 'pollen: --repetition-penalty 0: out of range .*\(0, inf\)' --repetition-penalty 0
bad_value 'pollen: --repetition-penalty "high": not a finite number' --repetition-penalty high
bad_value 'pollen: --seed -3: out of range' --seed -3
bad_value 'pollen: --threads 0: out of range' --threads 0
bad_value 'pollen: --threads "two": not an integer' --threads two
bad_value 'pollen: --fail-at-step "x": not an integer' --fail-at-step x
bad_value 'pollen: --gpus-per-node 0: out of range .*\[1, ' --gpus-per-node 0
bad_value 'pollen: --gpus-per-node "eight": not an integer' --gpus-per-node eight
bad_value 'pollen: --device -5: out of range .*\[0, ' --device -5
# serve takes its numbers through the same parser (refused before anything loads).
check_fails "serve --gpus-per-node 0" 'pollen: --gpus-per-node 0: out of range' "$POLLEN" serve "$set1" --gpus-per-node 0
check_fails "serve --device -5" 'pollen: --device -5: out of range' "$POLLEN" serve "$set1" --device -5
check_fails "serve --port x" 'pollen: --port "x": not an integer' "$POLLEN" serve "$set1" --port x
# Device options are accepted on the CPU backend (which has no devices) and change nothing.
out=$("$POLLEN" generate "$set1" --token-ids 5,17,42 --max-new-tokens 4 --json --quiet | grep -o '"ids":\[[0-9,]*\]')
out2=$(mpirun -np 2 "$POLLEN" generate "$TMP/bloom-4h-tp2" --token-ids 5,17,42 --max-new-tokens 4 --json --quiet \
  --gpus-per-node 1 --device 0 | grep -o '"ids":\[[0-9,]*\]')
check "--gpus-per-node/--device on the CPU backend: same tokens" test -n "$out" -a "$out" = "$out2"
# --backend cuda: without a GPU (or without a CUDA build) a clear error and a non-zero exit, never
# a crash; each rank names itself, its local rank and the device it picked.
if [ -e /dev/nvidiactl ]; then
  check_fails "generate --device past the visible GPUs" \
    'CUDA device 1023 for MPI rank 0 \(local rank 0 on its node, from --device 1023\).*(does not exist.*--gpus-per-node|CUDA_VISIBLE_DEVICES)' \
    "$POLLEN" generate "$set1" --prompt hi --backend cuda --device 1023
else
  check_fails "generate --backend cuda without a GPU" \
    'CUDA device 0 for MPI rank 0 \(local rank 0 on its node, from its local rank.*(no NVIDIA GPU|no CUDA backend)' \
    "$POLLEN" generate "$set1" --prompt hi --backend cuda
  check_fails "generate --backend cuda under mpirun without a GPU" \
    'CUDA device 1 for MPI rank 1 \(local rank 1 on its node.*(no NVIDIA GPU|no CUDA backend)' \
    mpirun -np 2 "$POLLEN" generate "$TMP/bloom-4h-tp2" --prompt hi --backend cuda
  check_fails "generate --backend cuda --gpus-per-node 1 under mpirun" \
    'CUDA device 0 for MPI rank 1 \(local rank 1 on its node, from local rank % --gpus-per-node 1\)' \
    mpirun -np 2 "$POLLEN" generate "$TMP/bloom-4h-tp2" --prompt hi --backend cuda --gpus-per-node 1
fi
e2e_done
