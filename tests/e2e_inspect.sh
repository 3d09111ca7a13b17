#!/usr/bin/env bash
# e2e_inspect.sh — `pollen inspect` on the fixture checkpoints (every storage format and dtype), on
# shard sets and rank files written by test_shard's helper, with --stats, --tensor/--head, --json,
# bad input, and a 64 GiB sparse checkpoint that must list instantly (headers only).
source tests/e2e.sh
HELPER=${PLN_BUILD:-build}/tests/test_shard
FIX=tests/fixtures/models

out() { "$POLLEN" inspect "$@" 2>&1; }
has() { grep -qE -- "$2" <<<"$1"; }              # has "$text" REGEX
# The dequantized / converted values printed by --tensor NAME --head K, one per line.
head_vals() { "$POLLEN" inspect "$@" | grep ' first ' | sed -E 's/.*: //' | tr ' ' '\n' | grep -v '^$'; }
# Max relative difference of two value lists (rel to max(|b|, 1e-3)).
max_rel() { paste <(echo "$1") <(echo "$2") | awk 'BEGIN{m=0} {d=$1-$2; if(d<0)d=-d; s=$2<0?-$2:$2; if(s<1e-3)s=1e-3; if(d/s>m)m=d/s} END{printf "%.6g", m}'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN{exit !(a+0 < b+0)}'; }
stat_field() { # stat_field "$text" TENSOR_NAME COLUMN(1-based among min max mean std absmax nan inf)
  grep -E "^(0 +)?$2 " <<<"$1" | head -1 |
    awk -v c="$3" '{n=NF; if ($NF ~ /\]$/ && $(NF-1) ~ /^\[/) n=NF-2; print $(n-7+c)}'
}

# ---- fixture checkpoints -------------------------------------------------------------------------
if [ -d "$FIX/bloom-4h" ]; then
  for d in fp32-st fp16-st bf16-st fp32-bin fp16-bin bf16-bin; do
    o=$(out "$FIX/bloom-4h/$d"); rc=$?
    check "inspect bloom-4h/$d exits 0" [ $rc = 0 ]
    check "bloom-4h/$d: config" has "$o" "vocab_size 1003, hidden_size 64, n_head 4 \(head_dim 16\), n_layer 2"
    check "bloom-4h/$d: qkv shape" has "$o" "h\.1\.self_attention\.query_key_value\.weight +[A-Z0-9]+ +\[192, 64\]"
    check "bloom-4h/$d: 4h_to_h shape" has "$o" "h\.0\.mlp\.dense_4h_to_h\.weight +[A-Z0-9]+ +\[64, 256\]"
    check "bloom-4h/$d: embedding" has "$o" "word_embeddings\.weight +[A-Z0-9]+ +\[1003, 64\] +128384|word_embeddings\.weight +F32 +\[1003, 64\] +256768"
    want=$(case $d in fp32*) echo F32;; fp16*) echo F16;; bf16*) echo BF16;; esac)
    check "bloom-4h/$d: totals are all $want" has "$o" "^totals:  $want [0-9]+ tensors [^;]*;  all"
    check "bloom-4h/$d: ln_f present" has "$o" "^ln_f\.bias +$want +\[64\]"
  done
  for d in fp32-st fp16-bin bf16-st; do
    o=$(out "$FIX/bloom-6h/$d"); rc=$?
    check "inspect bloom-6h/$d exits 0" [ $rc = 0 ]
    check "bloom-6h/$d: config" has "$o" "hidden_size 96, n_head 6 \(head_dim 16\), n_layer 2"
    check "bloom-6h/$d: qkv shape" has "$o" "h\.0\.self_attention\.query_key_value\.weight +[A-Z0-9]+ +\[288, 96\]"
  done
  # Same weights through the safetensors and the PyTorch readers: identical values and stats.
  T=h.1.mlp.dense_4h_to_h.weight
  a=$(head_vals "$FIX/bloom-4h/bf16-st" --tensor $T --head 32); b=$(head_vals "$FIX/bloom-4h/bf16-bin" --tensor "transformer.$T" --head 32)
  check "bf16 st and bin give the same 32 values" [ -n "$a" -a "$a" = "$b" ]
  check "head prints 32 values" [ "$(echo "$a" | wc -l)" = 32 ]
  c=$(head_vals "$FIX/bloom-4h/fp32-st" --tensor $T --head 32)
  r=$(max_rel "$a" "$c"); echo "bf16 vs fp32 head max rel diff: $r"
  check "bf16 values are the fp32 values rounded (rel $r)" lt "$r" 0.008
  # fp16 dirs hold the fp32 weights rounded to fp16: within half an fp16 ulp (2^-11 relative).
  a=$(head_vals "$FIX/bloom-4h/fp16-st" --tensor $T --head 32)
  r=$(max_rel "$a" "$c"); echo "fp16 vs fp32 head max rel diff: $r"
  check "fp16 values are the fp32 values rounded (rel $r)" lt "$r" 0.0005
  sa=$(out "$FIX/bloom-4h/bf16-st" --stats); sb=$(out "$FIX/bloom-4h/bf16-bin" --stats)
  check "stats of ln_f.weight agree across readers" [ "$(stat_field "$sa" ln_f.weight 1)" = "$(stat_field "$sb" ln_f.weight 1)" -a \
                                                     "$(stat_field "$sa" ln_f.weight 4)" = "$(stat_field "$sb" ln_f.weight 4)" ]
  check "stats: no NaN in fixtures" [ "$(stat_field "$sa" ln_f.weight 6)" = 0 ]
  j=$("$POLLEN" inspect "$FIX/bloom-4h/bf16-st" --json)
  check "json: kind checkpoint" has "$j" '"kind": "checkpoint"'
  check "json: config" has "$j" '"hidden_size": 64'
  check "json: format" has "$j" '"format": "safetensors"'
  single=$(ls "$FIX/bloom-4h/fp32-st"/*.safetensors | head -1)
  o=$(out "$single"); rc=$?
  check "inspect a single .safetensors file" [ $rc = 0 ]
  check "single file lists tensors" has "$o" "^totals:  F32 "
  single=$(ls "$FIX/bloom-4h/fp16-bin"/*.bin | tail -1)
  o=$(out "$single"); rc=$?
  check "inspect a single .bin file" [ $rc = 0 ]
else
  echo "SKIP fixture checkpoints (tests/fixtures/models missing)"
fi

# ---- shard sets from the test helper -------------------------------------------------------------
S8=$TMP/set-int8; S16=$TMP/set-fp16; SG=$TMP/set-g16
check "helper writes an int8 tp2 set" "$HELPER" --write-sample "$S8" --tp 2 --int8
check "helper writes an fp16 tp1 set" "$HELPER" --write-sample "$S16" --tp 1
check "helper writes an int8 group-16 tp2 set with int8 embedding" "$HELPER" --write-sample "$SG" --tp 2 --int8 --group 16 --quantize-embedding
o=$(out "$S8"); rc=$?
check "inspect int8 set exits 0" [ $rc = 0 ]
check "set line" has "$o" "layout bloom-tp-v1, tp 2, dtype int8 \(per output channel\), quantize_embedding no, vocab_padded 1004"
check "config line" has "$o" "vocab_size 1003, hidden_size 64, n_head 4"
check "rank files listed with sizes" has "$o" "rank 1: rank-1-of-2.pln  [0-9]+ bytes  xxh3 [0-9a-f]{16}"
check "74 tensor rows (37 per rank)" [ "$(grep -cE '^[01] +' <<<"$o")" = 74 ]
check "rank 1 embedding slice" has "$o" "^1 +word_embeddings\.weight +F16 +\[502, 64\] +64256 +rank-1-of-2\.pln +12288"
check "int8 weight and scale" has "$o" "^0 +h\.1\.mlp\.dense_4h_to_h\.weight_scale +F16 +\[64, 1\]"
check "every offset is 4 KiB aligned" [ -z "$(grep -E '^[01] +' <<<"$o" | awk '$NF % 4096 != 0')" ]
check "totals per dtype" has "$o" "^totals:  F16 58 tensors [^;]*;  I8 16 tensors [^;]*;  all 74 tensors"
o=$(out "$SG" --stats); rc=$?
check "stats on group-16 set" [ $rc = 0 ]
check "group-16 scales [rows, 4]" has "$o" "^0 +h\.0\.self_attention\.query_key_value\.weight_scale +F16 +\[96, 4\]"
check "int8 embedding has scales" has "$o" "^1 +word_embeddings\.weight_scale +F16 +\[502, 4\]"
check "int8 stats show the scale range" has "$o" "^0 +h\.0\.mlp\.dense_h_to_4h\.weight +I8 .*\[0\.00[0-9]+, 0\.0[0-9]+\]"
lnmin=$(stat_field "$o" ln_f.weight 1); lnmax=$(stat_field "$o" ln_f.weight 2)
check "LayerNorm weights near 1 (min $lnmin max $lnmax)" awk -v a="$lnmin" -v b="$lnmax" 'BEGIN{exit !(a >= 0.9 && b <= 1.1 && a < b)}'
o=$(out "$S16" --tensor word_embeddings.weight --head 4); rc=$?
check "--tensor on fp16 set" [ $rc = 0 ]
check "--tensor shows one row" [ "$(grep -cE '^0 +word_embeddings' <<<"$o")" = 1 ]
check "--head prints 4 values" has "$o" "^rank 0 word_embeddings\.weight first 4 of 64192: [-0-9.e]+ [-0-9.e]+ [-0-9.e]+ [-0-9.e]+$"
o=$(out "$S8/rank-1-of-2.pln"); rc=$?
check "inspect one rank file" [ $rc = 0 ]
check "rank file header" has "$o" "rank file: version 1, layout bloom-tp-v1, rank 1 of 2, 37 tensors, alignment 4096"
check "rank file: config from the manifest beside it" has "$o" "vocab_size 1003, hidden_size 64"
j=$("$POLLEN" inspect "$S8" --json --stats); rc=$?
check "json on set" [ $rc = 0 ]
check "json: kind" has "$j" '"kind": "shard-set"'
check "json: manifest included" has "$j" '"layout": "bloom-tp-v1"'
check "json: stats" has "$j" '"absmax": '
check "json: dequantized int8" has "$j" '"dequantized": true'
if command -v python3 >/dev/null; then
  check "json parses, 74 tensors, all aligned" python3 -c '
import json, sys
d = json.load(sys.stdin)
t = d["tensors"]
assert len(t) == 74, len(t)
assert all(x["offset"] % 4096 == 0 for x in t)
assert d["totals"]["I8"]["count"] == 16 and d["config"]["n_head"] == 4
' <<<"$j"
fi

# ---- sets written by `pollen reshard` (when this build has it): values traced back to the source ----
if "$POLLEN" reshard --help >/dev/null 2>&1 && [ -d "$FIX/bloom-4h" ]; then
  R16=$TMP/r-fp16; R8=$TMP/r-int8; SRC=$FIX/bloom-4h/fp16-st
  check "reshard fp16 tp2" "$POLLEN" reshard "$SRC" -o "$R16" --tp 2 --dtype fp16 --quiet
  check "reshard int8 tp2" "$POLLEN" reshard "$SRC" -o "$R8" --tp 2 --dtype int8 --quiet
  # Row-parallel dense: rank 1 holds columns 32..63, so its first 8 values are source values 32..39.
  D=h.0.self_attention.dense.weight
  src=$(head_vals "$SRC" --tensor $D --head 40 | tail -n 8)
  r1=$(head_vals "$R16" --tensor $D --head 8 | tail -n 8)
  check "fp16 rank 1 dense = source columns 32..39 exactly" [ -n "$src" -a "$src" = "$r1" ]
  # Column-parallel qkv: rank 0 row 0 = source row 0; int8 within half a quantization step.
  Q=h.0.self_attention.query_key_value.weight
  src=$(head_vals "$SRC" --tensor $Q --head 8); q0=$(head_vals "$R8" --tensor $Q --head 8 | head -n 8)
  d=$(paste <(echo "$src") <(echo "$q0") | awk 'BEGIN{m=0} {d=$1-$2; if(d<0)d=-d; if(d>m)m=d} END{print m}')
  echo "int8 rank 0 qkv head vs source: max abs diff $d"
  check "int8 dequantized values within half a step of the source (max $d)" lt "$d" 0.002
  o=$(out "$R8" --stats)
  check "stats show the converter's quantization error" has "$o" "^1 +$Q +I8 .*quant rel rms 0\.00[0-9]+"
  # int4: the set line names the group, the packed tensor shows U8 [rows, cols/2] with its
  # dequantized statistics and recorded error, and --head gives dequantized values within a step.
  R4=$TMP/r-int4
  check "reshard int4 g32 tp2" "$POLLEN" reshard "$SRC" -o "$R4" --tp 2 --dtype int4 --group-size 32 --quiet
  o=$(out "$R4" --stats)
  check "int4 set line" has "$o" "dtype int4 \(group size 32\), quantize_embedding no"
  check "int4 stats: U8 packed, dequantized, scale range, recorded error" has "$o" \
    "^0 +$Q +U8 +\[96, 32\] .*\[0\.0[0-9]+, 0\.0[0-9]+\]  quant rel rms 0\.0[5-9][0-9]*"
  q4=$(head_vals "$R4" --tensor $Q --head 8 | head -n 8)
  d=$(paste <(echo "$src") <(echo "$q4") | awk 'BEGIN{m=0} {d=$1-$2; if(d<0)d=-d; if(d>m)m=d} END{print m}')
  echo "int4 rank 0 qkv head vs source: max abs diff $d"
  check "int4 dequantized values near the source (max $d)" lt "$d" 0.05
  check "int4 head differs from the source (it is quantized)" [ "$src" != "$q4" ]
else
  echo "SKIP: pollen reshard not in this build"
fi

# ---- known statistics: NaN, Inf, int8 with group scales -------------------------------------------
SP=$TMP/special.pln
check "helper writes the special file" "$HELPER" --write-special "$SP"
o=$(out "$SP" --stats)
check "f32 stats: min -4 max 3 mean -0.3 absmax 4, 1 NaN 2 Inf" has "$o" "^0 +f32 +F32 +\[2, 4\] .* -4 +3 +-0\.3 +[0-9.]+ +4 +1 +2$"
check "int8 stats dequantized with group scales" has "$o" "^0 +q +I8 .* -15\.88 +15\.88 +1\.469 +[0-9.]+ +15\.88 +0 +0  \[0\.125, 2\]$"
o=$(out "$SP" --tensor q --head 8)
check "int8 head dequantized" has "$o" "first 8 of 8 \(dequantized\): 0\.5 1 -0\.75 1 15\.875 -15\.875 0 10$"
j=$("$POLLEN" inspect "$SP" --tensor f32 --head 8 --json)
check "json head: NaN/Inf as null" has "$(tr -d ' \n' <<<"$j")" '"head":\[1(\.0)?,-2(\.0)?,null,null,null,0\.5,3(\.0)?,-4(\.0)?\]'

# ---- listing reads headers only: a 64 GiB sparse checkpoint lists without touching its data ------
# Told by what the process touched, not by its time: GNU time's minor page faults (mapped pages
# touched; 64 GiB of data would be millions, headers a few thousand). Without GNU time, SKIP.
faults_of() { sed -n 's/^faults //p' "$TMP/ins.time"; }
few_faults() { local f; f=$(faults_of); [ -n "$f" ] && lt "$f" 100000; }
if [ -x /usr/bin/time ]; then INSPECT=(/usr/bin/time -f 'faults %R' -o "$TMP/ins.time" "$POLLEN" inspect)
else INSPECT=(); echo "SKIP: the listings' page faults: GNU time is not installed (make deps)"; fi
BIG=$TMP/big.safetensors
hdr='{"w":{"dtype":"F32","shape":[17179869184],"data_offsets":[0,68719476736]}}'
n=${#hdr}
if printf "$(printf '\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8)))" >"$BIG" 2>/dev/null &&
   printf '%s' "$hdr" >>"$BIG" && truncate -s $((8 + n + 68719476736)) "$BIG" 2>/dev/null && [ ${#INSPECT[@]} -gt 0 ]; then
  o=$(timeout 120 "${INSPECT[@]}" "$BIG"); rc=$?
  echo "inspect of a 64 GiB sparse checkpoint: $(faults_of) minor page faults"
  check "64 GiB checkpoint lists" [ $rc = 0 ]
  check "64 GiB checkpoint listing touched $(faults_of) pages (< 100000: headers only)" few_faults
  check "64 GiB tensor shape" has "$o" "^w +F32 +\[17179869184\] +68719476736"
  rm -f "$BIG"
else
  echo "SKIP sparse 64 GiB file (filesystem refused)"; rm -f "$BIG"
fi

SPARSE=$TMP/huge.pln
if [ ${#INSPECT[@]} -gt 0 ] && "$HELPER" --write-sparse "$SPARSE" 2>/dev/null; then
  o=$(timeout 120 "${INSPECT[@]}" "$SPARSE"); rc=$?
  echo "inspect of a 64 GiB sparse rank file: $(faults_of) minor page faults"
  check "64 GiB rank file lists" [ $rc = 0 ]
  check "64 GiB rank file listing touched $(faults_of) pages (< 100000: headers only)" few_faults
  check "64 GiB rank file tensor" has "$o" "^0 +huge +F16 +\[33554432, 1024\] +68719476736"
  rm -f "$SPARSE"
else
  echo "SKIP sparse 64 GiB rank file (filesystem refused)"; rm -f "$SPARSE"
fi

# ---- bad input and usage ---------------------------------------------------------------------------
check_fails "missing path" "$TMP/nope: no such file" "$POLLEN" inspect "$TMP/nope"
check_fails "missing tensor" "no tensor \"nope\"" "$POLLEN" inspect "$S16" --tensor nope
check_fails "--head without --tensor" "head needs --tensor" "$POLLEN" inspect "$S16" --head 3
check_fails "no path" "^pollen inspect: missing SET[|]CHECKPOINT \\(see pollen inspect --help\\)" "$POLLEN" inspect
cp "$S8/rank-0-of-2.pln" "$TMP/trunc.pln" && truncate -s 5000 "$TMP/trunc.pln"
check_fails "truncated rank file" "trunc\.pln: file is 5000 bytes but its header says" "$POLLEN" inspect "$TMP/trunc.pln"
cp -r "$S8" "$TMP/broken" && truncate -s 8192 "$TMP/broken/rank-1-of-2.pln"
check_fails "set with a short rank file" "rank-1-of-2\.pln: file size 8192 differs from the manifest" "$POLLEN" inspect "$TMP/broken"
printf 'PLNSHARD\x02\x00\x00\x00' >"$TMP/v2.pln"; head -c 200 /dev/zero >>"$TMP/v2.pln"
check_fails "future version" "v2\.pln: rank file version 2 is not supported" "$POLLEN" inspect "$TMP/v2.pln"
cp -r "$S8" "$TMP/swapped" && sed -i 's/"dtype": "int8"/"dtype": "fp16"/' "$TMP/swapped/manifest.json"
o=$(out "$TMP/swapped"); rc=$?
check "a set whose files disagree with the manifest is still listed" [ $rc = 0 ]
check "... with a warning naming the file and the mismatch" has "$o" "^warning: .*rank-0-of-2\.pln: tensor #5 is \"h\.0\.self_attention\.query_key_value\.weight\" I8 \[96, 64\] but layout bloom-tp-v1 expects .* F16 \[96, 64\]"
echo '{"format": "pollen-shards", "version": 1, "layout": "bloom-tp-v7"}' >"$TMP/broken/manifest.json"
check_fails "unknown layout" "layout \"bloom-tp-v7\" is not known" "$POLLEN" inspect "$TMP/broken"
e2e_done
