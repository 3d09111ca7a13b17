#!/usr/bin/env bash
# quality.sh — the quantization quality table of docs/BENCHMARKS.md ("Quality"): reshards a trained
# BLOOM (default tests/fixtures/models/bloom-kjv, trained by tests/fixtures/train_quality_model.py)
# to fp16, int8 per row, int8 groups of 128 and 32 (also with an int8 embedding), int4 groups of
# 128, 64 and 32, and prints per set, as a markdown table:
#   - bytes per weight of the linear layers (weights + scales over their fp16 element count) and
#     of the whole set (every tensor's bytes over the fp16 set's element count);
#   - perplexity ± its standard error on the held-out text (`pollen perplexity`, windows of CTX
#     every STRIDE tokens);
#   - against the fp16 set: mean KL(fp16 || set) ± its standard error, its 99th percentile and
#     maximum, top-1 agreement;
#   - greedy agreement: N_PROMPTS prompts (default: every held-out verse, 133; the first words of
#     each, evenly picked when fewer)
#     each continued greedily for N_NEW tokens, batched; the share of generated tokens equal to the
#     fp16 set's at the same position (after a first difference the continuations usually part,
#     so this is stricter than top-1 agreement), and how many continuations are identical.
# Rows whose dtype `pollen reshard` refuses (int4 before it exists) print SKIP with the reason.
# With LLAMA_DIR (a llama.cpp built by tools/bench/cpu-vs-llamacpp.sh --build: llama-quantize,
# llama-perplexity and the converter's venv), a second table puts llama.cpp beside it on the same
# checkpoint and text: its converter makes an F16 GGUF, llama-quantize Q8_0, Q4_0, Q4_1 and Q4_K_M
# (token embedding and output kept F16, as pollen keeps its embedding), and `llama-perplexity
# --kl-divergence` against the F16 GGUF's logits, windows of CTX tokens (llama.cpp scores the
# second half of each window, pollen every STRIDE tokens: the two meters see the same text but not
# the same tokens, so compare each tool's quantizations against its own fp16, row by row).
# Quality does not depend on timing, so any machine gives the same numbers for the same build;
# decode speed is `pollen bench`'s job (tools/bench/cpu.sh). The machine is printed above the table
# all the same (tools/bench/machine.sh). Scratch: $BENCH_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
POLLEN=$BUILD/pollen
MODEL=${MODEL:-tests/fixtures/models/bloom-kjv}
TEXT=${TEXT:-$MODEL/heldout.txt}
CTX=${CTX:-256}
STRIDE=${STRIDE:-128}
N_PROMPTS=${N_PROMPTS:-1000}   # more than the text has: every verse
N_NEW=${N_NEW:-32}
PROMPT_WORDS=${PROMPT_WORDS:-6}
DIR=${BENCH_DIR:-$BUILD/bench-quality}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
[ -x "$POLLEN" ] || { echo "quality.sh: $POLLEN not built (make build/pollen)" >&2; exit 1; }
[ -f "$TEXT" ] || { echo "quality.sh: no held-out text $TEXT (set TEXT=)" >&2; exit 1; }
# Scratch: emptied only when this script made it (its mark file, or the default in the build
# tree); any other non-empty directory, link or file at $DIR is refused, never deleted.
if [ -L "$DIR" ] || { [ -e "$DIR" ] && [ ! -d "$DIR" ]; }; then
  echo "quality.sh: BENCH_DIR $DIR is a symbolic link or not a directory; give a new path" >&2; exit 1
fi
if [ -d "$DIR" ] && [ -n "$(ls -A "$DIR")" ] && [ ! -f "$DIR/.quality-scratch" ] && [ "$DIR" != "$BUILD/bench-quality" ]; then
  echo "quality.sh: BENCH_DIR $DIR is not empty and was not made by this script; give a new or empty path" >&2; exit 1
fi
rm -rf "$DIR"; mkdir -p "$DIR"; : >"$DIR/.quality-scratch"

# name|reshard options
VARIANTS=(
  "fp16|--dtype fp16"
  "int8 per row|--dtype int8"
  "int8 g128|--dtype int8 --group-size 128"
  "int8 g32|--dtype int8 --group-size 32"
  "int8 g32 + int8 emb|--dtype int8 --group-size 32 --quantize-embedding"
  "int4 g128|--dtype int4 --group-size 128"
  "int4 g64|--dtype int4 --group-size 64"
  "int4 g32|--dtype int4 --group-size 32"
)

# The prompts: the first PROMPT_WORDS words of N_PROMPTS verses spread over the text (chapter
# heading lines "Book N" are not verses).
mapfile -t verses < <(grep -Ev '^[^ ]+( [^ ]+)? [0-9]+$' "$TEXT" | awk 'NF >= 8')
PROMPTS=()
step=$(( ${#verses[@]} / N_PROMPTS )); [ "$step" -ge 1 ] || step=1
for ((i = 0; i < ${#verses[@]} && ${#PROMPTS[@]} < N_PROMPTS; i += step)); do
  PROMPTS+=("$(cut -d' ' -f1-"$PROMPT_WORDS" <<<"${verses[$i]}")")
done
PARGS=()
for p in "${PROMPTS[@]}"; do PARGS+=(--prompt "$p"); done

json_num() { grep -o "\"$2\":[-0-9.eE+]*" "$1" | head -n 1 | cut -d: -f2; }
# bytes_per_weight SET REF_NUMEL_LIN REF_NUMEL_ALL: "linear whole" from the set's tensor table.
tensor_table() { "$POLLEN" inspect "$1" | awk '$1 ~ /^[0-9]+$/ && NF >= 6 { print $2, $3, $(NF-2), $0 }'; }
lin_re='^h\.[0-9]+\.(self_attention\.(query_key_value|dense)|mlp\.dense_(h_to_4h|4h_to_h))\.weight'
# numel of a tensor-table row: product of the numbers in its [shape].
numel_awk='{ s = $0; sub(/^[^[]*\[/, "", s); sub(/\].*/, "", s); n = split(s, d, /, */); m = 1; for (i = 1; i <= n; i++) m *= d[i]; }'

FP16=""
LIN_NUMEL=0; ALL_NUMEL=0
# shellcheck source=tools/bench/machine.sh
source tools/bench/machine.sh
echo "# $(date -u '+%Y-%m-%d %H:%M UTC')"
machine_report "$OMP_NUM_THREADS" "$POLLEN"
echo "# model $MODEL; text $TEXT; pollen perplexity --ctx $CTX --stride $STRIDE; greedy: ${#PROMPTS[@]} prompts x $N_NEW tokens"
echo
echo "| set | bytes/weight (linear) | bytes/weight (all) | perplexity | KL vs fp16 (mean ± se) | KL p99 | KL max | top-1 agreement | greedy = fp16 (tokens) | identical continuations |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for v in "${VARIANTS[@]}"; do
  name=${v%%|*}; opts=${v#*|}
  set_dir=$DIR/$(tr ' +' '__' <<<"$name")
  # shellcheck disable=SC2086
  if ! err=$("$POLLEN" reshard "$MODEL" -o "$set_dir" --tp 1 $opts --quiet 2>&1); then
    echo "| $name | SKIP: \`pollen reshard $opts\` refused: $(tr '\n|' ' /' <<<"$err" | cut -c1-160) | | | | | | | | | |"
    continue
  fi
  tensor_table "$set_dir" >"$set_dir.tensors"
  if [ -z "$FP16" ]; then
    FP16=$set_dir
    LIN_NUMEL=$(grep -E " F16 " "$set_dir.tensors" | awk '$1 ~ /'"$lin_re"'$/' | awk "$numel_awk"' { t += m } END { printf "%.0f", t }')
    ALL_NUMEL=$(awk "$numel_awk"' { t += m } END { printf "%.0f", t }' "$set_dir.tensors")
  fi
  lin_bytes=$(awk '$1 ~ /'"$lin_re"'/ { t += $3 } END { printf "%.0f", t }' "$set_dir.tensors")
  all_bytes=$(awk '{ t += $3 } END { printf "%.0f", t }' "$set_dir.tensors")
  "$POLLEN" perplexity "$set_dir" --file "$TEXT" --ctx "$CTX" --stride "$STRIDE" --kl-base "$FP16" --json >"$set_dir.ppl.json"
  "$POLLEN" generate "$set_dir" "${PARGS[@]}" --max-new-tokens "$N_NEW" --temperature 0 --json --quiet \
    | grep -o '"ids":\[[0-9,]*\]' | sed 's/"ids":\[//; s/\]//' >"$set_dir.greedy"
  [ "$set_dir" = "$FP16" ] && cp "$set_dir.greedy" "$DIR/reference.greedy"
  greedy=$(paste -d"|" "$DIR/reference.greedy" "$set_dir.greedy" | awk -F'|' '{
      na = split($1, a, ","); nb = split($2, b, ","); n = na > nb ? na : nb; same = 1
      for (i = 1; i <= n; i++) { tot++; if (i <= na && i <= nb && a[i] == b[i]) eq++; else same = 0 }
      ident += same; rows++ }
    END { printf "%.1f%% | %d / %d", 100 * eq / tot, ident, rows }')
  j=$set_dir.ppl.json
  b=$(grep -o '"base":{.*}' "$j")
  printf '| %s | %.3f | %.3f | %.3f ± %.3f | %.3g ± %.2g | %.3g | %.3g | %.2f%% | %s |\n' "$name" \
    "$(awk -v a="$lin_bytes" -v b="$LIN_NUMEL" 'BEGIN { print a / b }')" \
    "$(awk -v a="$all_bytes" -v b="$ALL_NUMEL" 'BEGIN { print a / b }')" \
    "$(json_num "$j" ppl)" "$(json_num "$j" ppl_stderr)" \
    "$(json_num <(echo "$b") kl_mean)" "$(json_num <(echo "$b") kl_stderr)" "$(json_num <(echo "$b") kl_p99)" \
    "$(json_num <(echo "$b") kl_max)" "$(awk -v a="$(json_num <(echo "$b") top1_agreement)" 'BEGIN { print 100 * a }')" "$greedy"
done
echo
echo "tokens scored: $(json_num "$FP16.ppl.json" scored) of $(json_num "$FP16.ppl.json" tokens); uniform perplexity would be $(grep -o '"vocab_size": *[0-9]*' "$MODEL/config.json" | grep -o '[0-9]*$')"
machine_load_after "$POLLEN"

# ---- llama.cpp beside it (LLAMA_DIR) ----
LLAMA_DIR=${LLAMA_DIR:-}
[ -n "$LLAMA_DIR" ] || { echo; echo "(llama.cpp: set LLAMA_DIR to a tools/bench/cpu-vs-llamacpp.sh --build tree for its table)"; exit 0; }
LSRC=$(ls -d "$LLAMA_DIR"/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | tail -n 1)
LBIN=$LLAMA_DIR/build/bin
LPY=$LLAMA_DIR/venv/bin/python
for f in "$LBIN/llama-quantize" "$LBIN/llama-perplexity" "$LPY"; do
  [ -x "$f" ] || { echo "quality.sh: $f missing: run tools/bench/cpu-vs-llamacpp.sh --build (LLAMA_DIR=$LLAMA_DIR)" >&2; exit 1; }
done
[ -n "$LSRC" ] || { echo "quality.sh: no llama.cpp source under $LLAMA_DIR" >&2; exit 1; }
F16G=$DIR/llama-f16.gguf
# llama.cpp's converter with two shims (tools/bench/llamacpp_convert.py says which and why)
PYTHONPATH="$LSRC:$LSRC/gguf-py" "$LPY" tools/bench/llamacpp_convert.py "$MODEL" --outtype f16 --outfile "$F16G" >"$DIR/llama-convert.log" 2>&1 \
  || { echo "quality.sh: llama.cpp's converter failed; see $DIR/llama-convert.log" >&2; exit 1; }
LTHREADS=${OMP_NUM_THREADS:-1}
"$LBIN/llama-perplexity" -m "$F16G" -f "$TEXT" -c "$CTX" -t "$LTHREADS" --kl-divergence-base "$DIR/llama-base.kld" >"$DIR/llama-f16.log" 2>&1 \
  || { echo "quality.sh: llama-perplexity (F16 base) failed; see $DIR/llama-f16.log" >&2; exit 1; }
echo
echo "llama.cpp on the same checkpoint and text: \`llama-perplexity --kl-divergence -c $CTX\` against its own F16 GGUF (llama.cpp vendored by $(basename "$(dirname "$(dirname "$LSRC")")"))"
echo
echo "| llama.cpp type | bits/weight (linear) | linear tensors stored as | perplexity | KL vs F16 (mean ± se) | KL p99 | KL max | top-1 agreement |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
# bits per weight of the four linear weights of every layer, and the types llama-quantize gave them
# (K-quants need rows of 256: narrower rows fall back to other types, which the table shows)
gguf_linear() {
  PYTHONPATH="$LSRC/gguf-py" "$LPY" - "$1" <<'EOF'
import collections, re, sys
import gguf
r = gguf.GGUFReader(sys.argv[1])
nb = ne = 0
types = collections.Counter()
for t in r.tensors:
    if re.fullmatch(r"blk\.\d+\.(attn_qkv|attn_output|ffn_up|ffn_down)\.weight", t.name):
        nb += int(t.n_bytes); ne += int(t.n_elements); types[t.tensor_type.name] += 1
print("%.3f|%s" % (8 * nb / ne, ", ".join("%s x%d" % kv for kv in sorted(types.items()))))
EOF
}
for t in Q8_0 Q4_0 Q4_1 Q4_K_M; do
  g=$DIR/llama-$t.gguf
  if ! "$LBIN/llama-quantize" --token-embedding-type f16 --output-tensor-type f16 "$F16G" "$g" "$t" "$LTHREADS" >"$DIR/llama-quantize-$t.log" 2>&1; then
    echo "| $t | SKIP: llama-quantize failed (see $DIR/llama-quantize-$t.log) | | | | | |"; continue
  fi
  log=$DIR/llama-$t.log
  if ! "$LBIN/llama-perplexity" -m "$g" -f "$TEXT" -c "$CTX" -t "$LTHREADS" --kl-divergence-base "$DIR/llama-base.kld" --kl-divergence >"$log" 2>&1; then
    echo "| $t | SKIP: llama-perplexity failed (see $log) | | | | | |"; continue
  fi
  ppl=$(grep -m1 'Mean PPL(Q) ' "$log" | sed 's/.*: *//; s/ *± */ ± /')
  kld=$(grep -m1 'Mean    KLD:' "$log" | sed 's/.*KLD: *//; s/ *± */ ± /')
  p99=$(grep -m1 '99.0%   KLD:' "$log" | awk '{ print $NF }')
  kmax=$(grep -m1 'Maximum KLD:' "$log" | awk '{ print $NF }')
  top=$(grep -m1 'Same top p:' "$log" | sed 's/.*: *//; s/ *±.*//')
  lin=$(gguf_linear "$g")
  echo "| $t | ${lin%%|*} | ${lin#*|} | $ppl | $kld | $p99 | $kmax | $top% |"
done
echo
echo "bits/weight (linear): the four linear weights of every layer, scales included (pollen's int4 g32 and Q4_0: 4.5; compare with 8 x pollen's bytes/weight (linear)); token embedding and output F16 on both sides; tokens scored: $(grep -o 'calculating perplexity over [0-9]* chunks' "$DIR/llama-f16.log" | grep -o '[0-9]*') windows of $CTX, the second half of each."
