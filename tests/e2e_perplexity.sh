#!/usr/bin/env bash
# e2e_perplexity.sh — `pollen perplexity`: per-token NLL and perplexity equal transformers' (the
# fixture's reference-ppl.json, same windows) on fp16 shards of bloom-4h; TP 2 equals TP 1; KL of a
# set against itself is 0 exactly with full top-1 agreement; int8 against fp16 gives a small
# positive KL; window planning (stride = ctx, --max-tokens, a text shorter than ctx); the trained
# bloom-kjv model's held-out perplexity equals transformers' and is far below uniform; clear errors
# for a missing file, a bad stride, a one-token text, a base of another vocabulary or TP.
source "$(dirname "$0")/e2e.sh"
if ! "$POLLEN" perplexity --help >/dev/null 2>&1 || ! command -v mpirun >/dev/null; then
  echo "SKIP: needs pollen perplexity and mpirun"; e2e_done; exit 0
fi
export OMP_NUM_THREADS=1
FX=tests/fixtures/models/bloom-4h
REF=$FX/reference-ppl.json
# json_num FILE KEY: the first number after "KEY": (compact or indented JSON).
json_num() { tr -d ' \n' <"$1" | grep -o "\"$2\":[-0-9.eE+]*" | head -n 1 | cut -d: -f2; }
# json_list FILE KEY: the array KEY, one value per line.
json_list() { tr -d ' \n' <"$1" | grep -o "\"$2\":\[[^]]*\]" | head -n 1 | sed 's/.*\[//; s/\]//' | tr , '\n'; }
# close A B TOL: |A - B| <= TOL * max(1, |B|)
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; if (m < 1) m = 1;
  if (a == "" || b == "" || d > t * m) { print "  " a " vs " b " (tol " t ")" > "/dev/stderr"; exit 1 } }'; }
# lists_close A B TOL: two files of numbers, same count, each pair within TOL (absolute); prints the max diff.
lists_close() { paste "$1" "$2" | awk -v t="$3" 'NF != 2 { bad = 1 } { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
  END { print "  " n " values, max |diff| " m > "/dev/stderr"; exit (bad || n == 0 || m > t) }'; }

R="$POLLEN reshard $FX/fp16-st --quiet"
check "reshard fp16 TP 1" $R --dtype fp16 --tp 1 -o "$TMP/f1"
check "reshard fp16 TP 2" $R --dtype fp16 --tp 2 -o "$TMP/f2"
check "reshard int8 TP 1" $R --dtype int8 --tp 1 -o "$TMP/i1"
check "reshard int8 g16 TP 2" $R --dtype int8 --group-size 16 --tp 2 -o "$TMP/i2"
TXT=$FX/reference-ppl.txt
ctx=$(json_num "$REF" ctx); stride=$(json_num "$REF" stride)

# 1. Against transformers: the same targets, every NLL within 2e-3, perplexity within 1e-4 relative.
"$POLLEN" perplexity "$TMP/f1" --file "$TXT" --ctx "$ctx" --stride "$stride" --json --per-token >"$TMP/p1.json"
check "TP 1 runs" test -s "$TMP/p1.json"
json_list "$REF" ids | tail -n +2 >"$TMP/ref_targets"
json_list "$TMP/p1.json" target_ids >"$TMP/p1_targets"
check "targets are the text's tokens after the first" cmp -s "$TMP/ref_targets" "$TMP/p1_targets"
check "window count as transformers' loop" test "$(json_num "$TMP/p1.json" windows)" = "$(json_num "$REF" windows)"
check "every token after the first scored once" test "$(json_num "$TMP/p1.json" scored)" = "$(( $(wc -l <"$TMP/ref_targets") ))"
json_list "$REF" nll >"$TMP/ref_nll"
json_list "$TMP/p1.json" nll >"$TMP/p1_nll"
check "per-token NLL vs transformers (2e-3)" lists_close "$TMP/p1_nll" "$TMP/ref_nll" 2e-3
check "mean NLL vs transformers" close "$(json_num "$TMP/p1.json" nll_mean)" "$(json_num "$REF" nll_mean)" 1e-4
check "perplexity vs transformers" close "$(json_num "$TMP/p1.json" ppl)" "$(json_num "$REF" ppl)" 1e-4
check "uncertainty is reported" awk -v s="$(json_num "$TMP/p1.json" ppl_stderr)" 'BEGIN { exit !(s > 0) }'

# 2. TP 2 equals TP 1.
mpirun -np 2 "$POLLEN" perplexity "$TMP/f2" --file "$TXT" --ctx "$ctx" --stride "$stride" --json --per-token >"$TMP/p2.json"
json_list "$TMP/p2.json" nll >"$TMP/p2_nll"
check "TP 2 per-token NLL equals TP 1 (1e-5)" lists_close "$TMP/p2_nll" "$TMP/p1_nll" 1e-5
check "TP 2 perplexity equals TP 1" close "$(json_num "$TMP/p2.json" ppl)" "$(json_num "$TMP/p1.json" ppl)" 1e-6

# 3. KL: a set against itself is 0 exactly, at TP 1 and TP 2; int8 against fp16 is small and positive.
out=$("$POLLEN" perplexity "$TMP/f1" --file "$TXT" --ctx "$ctx" --stride "$stride" --json --kl-base "$TMP/f1")
check "self KL mean 0 exactly (TP 1)" grep -q '"kl_mean":0.0,"kl_stderr":0.0,"kl_median":0.0,"kl_p99":0.0,"kl_max":0.0,"top1_agreement":1.0' <<<"$out"
check "self ln(PPL ratio) 0 exactly" grep -q '"ln_ppl_ratio":0.0,' <<<"$out"
out=$(mpirun -np 2 "$POLLEN" perplexity "$TMP/f2" --file "$TXT" --ctx "$ctx" --stride "$stride" --json --kl-base "$TMP/f2")
check "self KL 0 exactly (TP 2)" grep -q '"kl_mean":0.0,"kl_stderr":0.0,"kl_median":0.0,"kl_p99":0.0,"kl_max":0.0,"top1_agreement":1.0' <<<"$out"
"$POLLEN" perplexity "$TMP/i1" --file "$TXT" --ctx "$ctx" --stride "$stride" --json --per-token --kl-base "$TMP/f1" >"$TMP/k1.json"
klm=$(json_num "$TMP/k1.json" kl_mean); klx=$(json_num "$TMP/k1.json" kl_max); k99=$(json_num "$TMP/k1.json" kl_p99)
check "int8 vs fp16: 0 < mean KL <= p99 <= max < 0.1" awk -v m="$klm" -v p="$k99" -v x="$klx" 'BEGIN { exit !(m > 0 && m <= p && p <= x && x < 0.1) }'
check "int8 vs fp16: base perplexity is the fp16 one" close "$(tr -d '\n' <"$TMP/k1.json" | grep -o '"base":{[^}]*' | grep -o '"ppl":[0-9.e+]*' | cut -d: -f2)" "$(json_num "$TMP/p1.json" ppl)" 1e-9
check "int8 vs fp16: mean of the per-token KL list" close "$(json_list "$TMP/k1.json" kl | awk '{ s += $1; n++ } END { printf "%.12g", s / n }')" "$klm" 1e-6
top1=$(json_num "$TMP/k1.json" top1_agreement)
check "int8 vs fp16: top-1 agreement in (0.9, 1]" awk -v a="$top1" 'BEGIN { exit !(a > 0.9 && a <= 1) }'
out=$(mpirun -np 2 "$POLLEN" perplexity "$TMP/i2" --file "$TXT" --ctx "$ctx" --stride "$stride" --json --kl-base "$TMP/f2")
check "int8 g16 TP 2 vs fp16 TP 2: KL > 0" awk -v m="$(json_num <(echo "$out") kl_mean)" 'BEGIN { exit !(m > 0 && m < 0.1) }'
out=$("$POLLEN" perplexity "$TMP/i1" --file "$TXT" --ctx "$ctx" --stride "$stride" --kl-base "$TMP/f1")
check "text report names KL and top-1 agreement" grep -q "KL(base || set)   mean .* 99% .* max" <<<"$out"
check "text report gives perplexity with its uncertainty" grep -Eq "^perplexity +[0-9.]+ ± [0-9.]+" <<<"$out"

# 4. Window planning.
n=$(( $(wc -l <"$TMP/ref_targets") + 1 ))
out=$("$POLLEN" perplexity "$TMP/f1" --file "$TXT" --ctx 32 --stride 32 --json)
w=$(( 1 + (n - 32 + 31) / 32 ))
check "stride = ctx: $w windows, their first tokens unscored" test "$(json_num <(echo "$out") scored)" = $(( n - 1 - (w - 1) ))
out=$("$POLLEN" perplexity "$TMP/f1" --file "$TXT" --ctx 32 --max-tokens 100 --json)
check "--max-tokens 100: 99 scored, default stride ctx/2" grep -q '"tokens":100,"scored":99,"ctx":32,"stride":16,"windows":6' <<<"$out"
out=$("$POLLEN" perplexity "$TMP/f1" --file "$TXT" --ctx 4096 --json)
check "ctx longer than the text: one window over it all" grep -q "\"tokens\":$n,\"scored\":$((n - 1)),\"ctx\":$n,\"stride\":$((n / 2)),\"windows\":1" <<<"$out"
out=$("$POLLEN" perplexity "$TMP/f1" --file "$TXT" --ctx 4096 --stride 3000 --json)
check "a stride longer than the text shrinks with the window" grep -q "\"scored\":$((n - 1)),\"ctx\":$n,\"stride\":$n,\"windows\":1" <<<"$out"

# 5. The trained model: held-out perplexity equals transformers' and is far below uniform (2048).
KJV=tests/fixtures/models/bloom-kjv
if [ -f "$KJV/reference-ppl.json" ]; then
  check "bloom-kjv: reshard" "$POLLEN" reshard "$KJV" -o "$TMP/kjv" --tp 1 --dtype fp16 --quiet
  "$POLLEN" perplexity "$TMP/kjv" --file "$KJV/heldout.txt" --ctx 256 --stride 128 --json --per-token >"$TMP/kjv.json"
  check "bloom-kjv: held-out perplexity vs transformers" close "$(json_num "$TMP/kjv.json" ppl)" "$(json_num "$KJV/reference-ppl.json" ppl)" 1e-4
  json_list "$KJV/reference-ppl.json" nll >"$TMP/kjv_ref_nll"; json_list "$TMP/kjv.json" nll >"$TMP/kjv_nll"
  check "bloom-kjv: per-token NLL vs transformers (2e-3)" lists_close "$TMP/kjv_nll" "$TMP/kjv_ref_nll" 2e-3
  check "bloom-kjv: perplexity far below uniform" awk -v p="$(json_num "$TMP/kjv.json" ppl)" 'BEGIN { exit !(p < 2048 / 10) }'
  check_fails "a base of another vocabulary is refused" "base set has a vocabulary of 2048 and .*f1 one of 1003" \
    "$POLLEN" perplexity "$TMP/f1" --file "$TXT" --kl-base "$TMP/kjv"
fi

# 6. Errors name what is wrong.
check_fails "no --file" "^pollen perplexity: missing required option --file \\(see pollen perplexity --help\\)" "$POLLEN" perplexity "$TMP/f1"
check_fails "missing text file" "pollen: --file: .*nope.txt" "$POLLEN" perplexity "$TMP/f1" --file "$TMP/nope.txt"
check_fails "stride over ctx" "pollen: --stride 64: must not exceed --ctx 32" "$POLLEN" perplexity "$TMP/f1" --file "$TXT" --ctx 32 --stride 64
check_fails "bad --ctx" 'pollen: --ctx 1: out of range' "$POLLEN" perplexity "$TMP/f1" --file "$TXT" --ctx 1
printf 'a' >"$TMP/one.txt"
check_fails "a one-token text" "1 token; perplexity needs at least 2" "$POLLEN" perplexity "$TMP/f1" --file "$TMP/one.txt"
check_fails "--per-token without --json" "pollen: --per-token needs --json" "$POLLEN" perplexity "$TMP/f1" --file "$TXT" --per-token
check_fails "a base of another TP" "the base set is TP=2 and .*f1 is TP=1" "$POLLEN" perplexity "$TMP/f1" --file "$TXT" --kl-base "$TMP/f2"
# Same vocabulary size, another tokenizer (one token's string changed): refused before any pass.
cp -r $FX/fp16-st "$TMP/other-tok"
sed -i 's/"Hello"/"HellQ"/; t; s/"a":/"Q":/' "$TMP/other-tok/tokenizer.json"
check "another tokenizer: the file differs" bash -c "! cmp -s $FX/fp16-st/tokenizer.json $TMP/other-tok/tokenizer.json"
check "reshard with another tokenizer" "$POLLEN" reshard "$TMP/other-tok" -o "$TMP/ot1" --tp 1 --dtype fp16 --quiet
check_fails "a base with another tokenizer is refused at start" "its tokenizer .* differs from .*f1's" \
  "$POLLEN" perplexity "$TMP/f1" --file "$TXT" --kl-base "$TMP/ot1"
check_fails "missing base set" "nonexistent.*manifest.json" "$POLLEN" perplexity "$TMP/f1" --file "$TXT" --kl-base "$TMP/nonexistent"
e2e_done
