#!/usr/bin/env bash
# cpu-vs-llamacpp.sh — pollen against llama.cpp on the CPU, side by side (docs/BENCHMARKS.md "CPU
# against llama.cpp"). Optional: no test needs it.
#
#   tools/bench/cpu-vs-llamacpp.sh [--build] [--avx2] [--same-placement] [--threads N] [--reps R]
#                                  [--layers K] [--model NAME]
#
# --model     the `pollen synth` model, on both sides: bloom-560m (default) or llama-3.2-1b (any
#             model synth knows; the Llama family goes through the converter's LlamaModel, BLOOM's
#             through BloomModel). Both sides keep the tied embedding as the checkpoint has it (no
#             lm_head in pollen's set, no output.weight in the GGUF); the script checks that, and
#             the layer count and vocabulary, before it times anything.
# --avx2      no AVX-512 on either side: pollen's CPU kernels forced to their AVX2 tier
#             (PLN_CPU_ISA=avx2; each run's cpu_isa is checked) and llama.cpp from a second build
#             in $LLAMA_DIR/build-avx2 (-DGGML_NATIVE=OFF, AVX/AVX2/FMA/F16C/BMI2 on, every AVX-512
#             and AMX option off; AVX-VNNI on where the CPU has it, as pollen's AVX2 tier uses it
#             there); `objdump -d` must find no zmm register in its binaries. With --build, builds
#             that second tree (the same three targets).
# --same-placement  a repetition counts only when both tools' runs began and ended with the first
#             two CPUs in one placement (near or far apart, below), the same for both; otherwise it
#             is run again, up to SAME_TRIES tries (default 6), the last of which counts whatever
#             the placement. On a VM whose vCPUs move, this keeps a cell from comparing the
#             placements instead of the tools.
# --build     fetches the llama-cpp-python sdist from PyPI (it vendors llama.cpp with its
#             convert_hf_to_gguf.py; version $LLAMA_CPP_PYTHON_VERSION, default 0.3.36 = llama.cpp
#             0c1e570), builds llama-bench, llama-batched-bench, llama-quantize and llama-perplexity
#             (tools/bench/quality.sh's llama.cpp table) (Release,
#             -DGGML_NATIVE=ON, CPU only; about 5 min on 2 idle cores) and a Python venv for the
#             converter (Debian's python3-torch + transformers from PyPI), all under $LLAMA_DIR
#             (default build/llamacpp). Without --build those must already be there.
# Then: `pollen synth` writes the random --model (--layers K keeps K layers), llama.cpp's own
# converter turns it into F16 GGUF (torch's float8 dtype names, missing from torch 1.13, are
# stubbed; the synthetic tokenizer's unknown fingerprint is declared BLOOM's pre-tokenizer),
# llama-quantize makes Q8_0, Q8_0 with an F16 embedding, Q4_0 and Q4_K_M (both with an F16
# embedding, as pollen's int4 keeps it), and pollen reshards the same checkpoint to the matching
# precisions. For each pair the two tools run in turn, R times (interleaved, so a disturbance hits
# both), with the same threads and an f16 KV cache on both sides:
#   prefill: a 512-token prompt (pollen bench --prompt-len 512; llama-bench -p 512 -n 0);
#   decode at batch 1, 8, 32: CONTEXT tokens of context then STEPS steps (pollen bench --batch
#   --context --steps; llama-batched-bench -npp CONTEXT -ntg STEPS -npl 1,8,32); pollen with
#   --mbu off, so that its steps run back to back as llama.cpp's do (no copy between them).
# Each cell keeps the best of the R runs (the least disturbed); the ratio is pollen's throughput
# over llama.cpp's, so > 1 means pollen is faster. The last column turns the prefill and batch-32
# rates into operations per second (2 per multiply-add of the model's weights, logits rows and
# attention keys, as pollen bench counts them; the same arithmetic for both tools), to set beside
# the FMA peak above the table where the arithmetic is fp32 (pollen's fp16 and exact-float int8;
# llama.cpp's F16), or the integer ops of the integer-dot path and of Q8_0 / Q4_0 / Q4_K_M. The
# column after it says, per run, whether the first two CPUs sat near or far apart just before
# each tool ran, and after it where they had moved ("near>far"; `pollen bench --copy-only`'s
# core-to-core latency, under or over 100 ns, probed before and after each tool): on a VM
# the host moves the vCPUs, and far apart the copy bandwidth doubles on the Zen 5 here while
# lines shared by the threads cost more (kernels/cpu/cpu.h NEIGHBOUR_NOTE), so a ratio between
# runs in different placements compares the placements too. Before each pair's first run both
# tools' model files leave the page cache (`dd iflag=nocache count=0`) and are read back by `cat`:
# each pair starts from the same state whatever ran before (files the converter wrote, a `verify`
# that faulted a set in without huge-page advice, another table's runs), which moved pollen's
# batch-1 decode by 3-7 % on the Zen 5 VM (formats/common.c MAP_HUGE_NOTE); how each tool then maps
# those pages (pollen asks for 2 MiB pages, llama.cpp does not) is the tool's own. Rows whose pollen dtype reshard refuses (int4
# before it exists) print SKIP. Each pair first tries llama.cpp's default on a 32-token prompt:
# where it dies by a signal (its weight repacking for AMX tiles died in ldtilecfg, SIGSEGV, on an
# Intel Xeon VM with AMX), that pair's llama.cpp runs take --repack 0 / --no-repack, its own
# kernels without the repack, and the row's label says so. The load average is printed before and after: figures from a
# busy machine are not worth keeping. Above the table, the machine (tools/bench/machine.sh): CPU
# model, vendor, family/model/stepping and microarchitecture, the SIMD flags, online CPUs and
# threads used, memory, the STREAM copy bandwidth and the FMA peak of pollen's kernels' tier on 1
# thread and all CPUs and the core-to-core latency (`pollen bench --copy-only`). Scratch: $BENCH_DIR (default build/bench-llamacpp).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
POLLEN=$BUILD/pollen
LLAMA_DIR=${LLAMA_DIR:-$BUILD/llamacpp}
LLAMA_CPP_PYTHON_VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
DIR=${BENCH_DIR:-$BUILD/bench-llamacpp}
THREADS=2; REPS=3; LAYERS=""; MODEL=bloom-560m; DO_BUILD=0; AVX2=0; SAME=0; SAME_TRIES=${SAME_TRIES:-6}
PROMPT_LEN=${PROMPT_LEN:-512}; CONTEXT=${CONTEXT:-32}; STEPS=${STEPS:-16}
while [ $# -gt 0 ]; do
  case $1 in
    --build) DO_BUILD=1 ;;
    --avx2) AVX2=1 ;;
    --same-placement) SAME=1 ;;
    --threads) THREADS=$2; shift ;;
    --reps) REPS=$2; shift ;;
    --layers) LAYERS=$2; shift ;;
    --model) MODEL=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cpu-vs-llamacpp.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for v in "$THREADS" "$REPS" "$SAME_TRIES"; do [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "cpu-vs-llamacpp.sh: --threads/--reps/SAME_TRIES want a positive integer, got '$v'" >&2; exit 2; }; done
[ -z "$LAYERS" ] || [[ $LAYERS =~ ^[1-9][0-9]*$ ]] || { echo "cpu-vs-llamacpp.sh: --layers wants a positive integer, got '$LAYERS'" >&2; exit 2; }
[[ $MODEL =~ ^[a-z0-9.-]+$ ]] || { echo "cpu-vs-llamacpp.sh: --model wants a pollen synth model name (bloom-560m, llama-3.2-1b, ...), got '$MODEL'" >&2; exit 2; }
[ -x "$POLLEN" ] || { echo "cpu-vs-llamacpp.sh: $POLLEN not built (make build/pollen)" >&2; exit 1; }
# shellcheck source=tools/bench/machine.sh
source tools/bench/machine.sh
SRC_DIR=$LLAMA_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp
# --avx2: a second build without AVX-512 (ggml's x86 options: no -march=native, each extension
# named; AVX-VNNI only where the CPU has it, as pollen's AVX2 tier uses it there too)
if [ "$AVX2" = 1 ]; then
  LLAMA_BUILD=$LLAMA_DIR/build-avx2
  ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
    -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  if grep -qw avx_vnni /proc/cpuinfo; then ISA_FLAGS+=(-DGGML_AVX_VNNI=ON); else ISA_FLAGS+=(-DGGML_AVX_VNNI=OFF); fi
else
  LLAMA_BUILD=$LLAMA_DIR/build
  ISA_FLAGS=(-DGGML_NATIVE=ON)
fi
BIN=$LLAMA_BUILD/bin
PY=$LLAMA_DIR/venv/bin/python

if [ "$DO_BUILD" = 1 ]; then
  mkdir -p "$LLAMA_DIR"
  tarball=$LLAMA_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
  if [ ! -f "$tarball" ]; then
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$LLAMA_DIR"
  fi
  [ -d "$SRC_DIR" ] || tar -xzf "$tarball" -C "$LLAMA_DIR"
  nice cmake -S "$SRC_DIR" -B "$LLAMA_BUILD" -DCMAKE_BUILD_TYPE=Release "${ISA_FLAGS[@]}" \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$LLAMA_BUILD.cmake.log" 2>&1 \
    || { echo "cpu-vs-llamacpp.sh: cmake configure failed; see $LLAMA_BUILD.cmake.log" >&2; exit 1; }
  nice cmake --build "$LLAMA_BUILD" --config Release -j "$(getconf _NPROCESSORS_ONLN)" \
    --target llama-bench llama-batched-bench llama-quantize llama-perplexity >"$LLAMA_BUILD.build.log" 2>&1 \
    || { echo "cpu-vs-llamacpp.sh: building llama.cpp failed; see $LLAMA_BUILD.build.log" >&2; exit 1; }
  if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "cpu-vs-llamacpp.sh: llama.cpp's converter needs torch: apt-get install python3-torch" >&2; exit 1
  fi
  [ -x "$PY" ] || /usr/bin/python3 -m venv --system-site-packages "$LLAMA_DIR/venv"
  "$PY" -m pip install -q "transformers==4.44.2" tokenizers safetensors sentencepiece pyyaml tqdm "protobuf<5"
  echo "built llama.cpp (vendored by llama-cpp-python $LLAMA_CPP_PYTHON_VERSION) in $LLAMA_DIR"
fi
for t in llama-bench llama-batched-bench llama-quantize; do
  [ -x "$BIN/$t" ] || { echo "cpu-vs-llamacpp.sh: $BIN/$t missing: run with --build$([ "$AVX2" = 0 ] || echo " --avx2") first (LLAMA_DIR=$LLAMA_DIR)" >&2; exit 1; }
done
[ -x "$PY" ] || { echo "cpu-vs-llamacpp.sh: $PY missing: run with --build first" >&2; exit 1; }

if [ "$AVX2" = 1 ]; then
  export PLN_CPU_ISA=avx2
  command -v objdump >/dev/null || { echo "cpu-vs-llamacpp.sh: --avx2 checks llama.cpp's binaries with objdump: apt-get install binutils" >&2; exit 1; }
  ZMM_CHECK=""
  for t in llama-bench llama-batched-bench; do
    # instructions, those on ymm (AVX/AVX2) and those on zmm (AVX-512) registers
    read -r n y z < <(objdump -d --no-show-raw-insn "$BIN/$t" | awk '/^ +[0-9a-f]+:\t/ { n++ } /%ymm/ { y++ } /%zmm/ { z++ } END { print n + 0, y + 0, z + 0 }')
    [ "$n" -gt 0 ] || { echo "cpu-vs-llamacpp.sh: --avx2: objdump could not disassemble $BIN/$t" >&2; exit 1; }
    [ "$z" = 0 ] || { echo "cpu-vs-llamacpp.sh: --avx2: $BIN/$t has $z instructions on zmm registers (AVX-512); rebuild with --build --avx2" >&2; exit 1; }
    ZMM_CHECK+=" $t: $y ymm, $z zmm of $n instructions;"
  done
fi

# ---- the model, on both sides ------------------------------------------------------------------
mkdir -p "$DIR"
tag=$MODEL${LAYERS:+-L$LAYERS}
src=$DIR/$tag
[ -d "$src" ] || "$POLLEN" synth --model "$MODEL" ${LAYERS:+--layers "$LAYERS"} -o "$src" --quiet
f16=$DIR/$tag-f16.gguf
if [ ! -f "$f16" ]; then
  # llama.cpp's converter, with two shims (tools/bench/llamacpp_convert.py says which and why)
  PYTHONPATH="$SRC_DIR:$SRC_DIR/gguf-py" "$PY" tools/bench/llamacpp_convert.py "$src" --outtype f16 --outfile "$f16" >"$DIR/convert.log" 2>&1 \
    || { echo "cpu-vs-llamacpp.sh: llama.cpp's converter failed; see $DIR/convert.log" >&2; tail -n 5 "$DIR/convert.log" >&2; exit 1; }
fi
quant() { # quant NAME TYPE [llama-quantize options]: $DIR/$tag-NAME.gguf from the F16 one
  local out=$DIR/$tag-$1.gguf type=$2 log=$DIR/quantize-$1.log; shift 2
  [ -f "$out" ] || "$BIN/llama-quantize" "$@" "$f16" "$out" "$type" "$THREADS" >"$log" 2>&1 \
    || { echo "cpu-vs-llamacpp.sh: llama-quantize $type failed; see $log" >&2; exit 1; }
  echo "$out"
}
q8=$(quant q8_0 Q8_0)
q8e=$(quant q8_0-f16emb Q8_0 --token-embedding-type f16)
q40=$(quant q4_0-f16emb Q4_0 --token-embedding-type f16)
q4k=$(quant q4_k_m-f16emb Q4_K_M --token-embedding-type f16)
# label | pollen reshard options | llama.cpp gguf | pollen bench options. int8 runs twice: on pollen's
# exact float path (its default) and with --int-dot on, the arithmetic llama.cpp's Q8_0 always uses
# (activations quantized per block of 32); int4 takes the integer-dot path by default (--int-dot auto).
PAIRS=(
  "fp16 ↔ F16|--dtype fp16|$f16|"
  "int8 g32 + int8 embedding ↔ Q8_0|--dtype int8 --group-size 32 --quantize-embedding|$q8|"
  "int8 g32 + int8 embedding, --int-dot on ↔ Q8_0|--dtype int8 --group-size 32 --quantize-embedding|$q8|--int-dot on"
  "int8 per-row ↔ Q8_0 body, F16 embedding|--dtype int8|$q8e|"
  "int8 per-row, --int-dot on ↔ Q8_0 body, F16 embedding|--dtype int8|$q8e|--int-dot on"
  "int4 g32 ↔ Q4_0, F16 embedding|--dtype int4 --group-size 32|$q40|"
  "int4 g128 ↔ Q4_K_M, F16 embedding|--dtype int4 --group-size 128|$q4k|"
)
# ONLY=REGEX keeps the pairs whose label matches (grep -E)

# set_of OPTS: pollen's TP 1 set of the checkpoint for those reshard options (made once); on a
# refusal prints reshard's message on stderr and fails
set_of() {
  local d=$DIR/$tag-$(tr ' ' '_' <<<"$1" | tr -d '-') err
  # shellcheck disable=SC2086
  if [ ! -d "$d" ] && ! err=$("$POLLEN" reshard "$src" -o "$d" --tp 1 $1 --quiet 2>&1); then
    echo "$err" >&2; return 1
  fi
  echo "$d"
}
# The same model on both sides: layers, vocabulary rows and whether the output matrix is the tied
# embedding (pollen's set has no lm_head tensor; the GGUF no output.weight) must agree, or the
# tokens/s below would be for different shapes.
ref_set=$(set_of "--dtype fp16") || { echo "cpu-vs-llamacpp.sh: pollen reshard --dtype fp16 of $src failed" >&2; exit 1; }
p_shape=$("$POLLEN" inspect "$ref_set" | awk '
  / n_layer [0-9]+/ { for (i = 1; i < NF; i++) if ($i == "n_layer") { l = $(i + 1); sub(/,/, "", l) } }
  / vocab_padded [0-9]+/ { for (i = 1; i < NF; i++) if ($i == "vocab_padded") v = $(i + 1) }
  $2 ~ /(^|\.)lm_head\.weight$/ { lm = 1 }
  END { print l + 0, v + 0, lm ? "untied" : "tied" }')
g_shape=$(PYTHONPATH="$SRC_DIR/gguf-py" "$PY" - "$f16" <<'EOF2'
import sys
from gguf import GGUFReader
t = {x.name: [int(d) for d in x.shape] for x in GGUFReader(sys.argv[1]).tensors}
layers = len({n.split(".")[1] for n in t if n.startswith("blk.")})
print(layers, t["token_embd.weight"][1], "untied" if "output.weight" in t else "tied")
EOF2
) || { echo "cpu-vs-llamacpp.sh: could not read the tensors of $f16 with gguf-py" >&2; exit 1; }
if [ "$p_shape" != "$g_shape" ]; then
  echo "cpu-vs-llamacpp.sh: not the same model on both sides: pollen's set has (layers, vocab, output) = ($p_shape), llama.cpp's GGUF ($g_shape); remove $DIR/$tag* and rerun" >&2
  exit 1
fi

# ---- runs ----------------------------------------------------------------------------------------
num() { grep -o "\"$1\": *[-0-9.eE+]*" | head -n 1 | sed 's/.*: *//'; }
best() { awk 'BEGIN { b = "" } $1 != "" && (b == "" || $1 > b) { b = $1 } END { print b }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "—"; else printf "%.2f×", a / b }'; }
# the files out of the page cache and read back in one pass (see the usage notes above)
fresh_cache() {
  local f
  for f in "$@"; do
    dd if="$f" iflag=nocache count=0 status=none 2>/dev/null || true
    cat "$f" >/dev/null
  done
}
# where the first two CPUs sat just before a run: "near" or "far" by the core-to-core latency
# (kernels/cpu/cpu.h NEIGHBOUR_NOTE: on the Zen 5 VM 20-65 ns or 155-210 ns, nothing between; far
# apart the copy doubles and cache lines shared by the threads cost more), "n/a" on one CPU
placement() {
  "$POLLEN" bench --copy-only --stream-mib 8 --json 2>/dev/null | grep -o '"core_to_core_ns":[0-9.e+-]*' | cut -d: -f2 |
    awk 'BEGIN { p = "n/a" } $1 != "" { p = $1 < 100 ? "near" : "far" } END { print p }'
}
# Both tools run with their OpenMP defaults (ggml's CPU backend is built with OpenMP too): a
# forced OMP_WAIT_POLICY=passive, as this script once set, put every thread to sleep at each of
# the ~150 barriers of a decode step and cost pollen about a quarter of its batch-1 speed.
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-(default)}"
machine_report "$THREADS" "$POLLEN"
if [ "$AVX2" = 1 ]; then
  echo "# --avx2: pollen PLN_CPU_ISA=avx2 (cpu_isa checked in each run); llama.cpp $LLAMA_BUILD (objdump -d:${ZMM_CHECK%;})"
else
  echo "# SIMD: pollen's best tier ($("$POLLEN" bench --copy-only --stream-mib 8 --json 2>/dev/null | grep -o '"cpu_isa":"[a-z0-9]*"' | cut -d'"' -f4)); llama.cpp -DGGML_NATIVE=ON"
fi
echo "# $MODEL${LAYERS:+ cut to $LAYERS layers} (pollen synth, random weights; both sides: $(awk '{ print $1 " layers, vocab " $2 ", " $3 " output" }' <<<"$p_shape")); $THREADS threads each; best of $REPS interleaved runs$([ "$SAME" = 0 ] || echo ", each with both tools in one placement (--same-placement, up to $SAME_TRIES tries)"); f16 KV both"
echo "# pollen bench --prompt-len $PROMPT_LEN --batch 1,8,32 --context $CONTEXT --steps $STEPS --kv-dtype f16 --threads $THREADS --mbu off"
echo "# llama-bench -p $PROMPT_LEN -n 0 -t $THREADS -r 1; llama-batched-bench -npp $CONTEXT -ntg $STEPS -npl 1,8,32 -t $THREADS"
echo "# page cache: each pair's files (pollen's rank files, the GGUF) dropped and read back by cat before its first run"
echo
echo "| precision pair | prefill $PROMPT_LEN | decode b1 | b8 | b32 | pollen tok/s (prefill / b1 / b8 / b32) | llama.cpp tok/s | GOP/s prefill / b32: pollen; llama.cpp | vCPUs per run: pollen; llama.cpp |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for pair in "${PAIRS[@]}"; do
  IFS='|' read -r label popts gguf bopts <<<"$pair"
  [ -z "${ONLY:-}" ] || grep -qE "$ONLY" <<<"$label" || continue
  if ! set_dir=$(set_of "$popts" 2>"$DIR/reshard.err"); then
    echo "| $label | SKIP: \`pollen reshard $popts\` refused: $(tr '\n|' ' /' <"$DIR/reshard.err" | cut -c1-120) | | | | | | |"
    continue
  fi
  # llama.cpp's default repacks quantized weights for its fastest kernels (AMX tiles where the CPU
  # has them); where that default dies (a signal: seen with AMX in a VM, SIGSEGV in ldtilecfg),
  # the pair's llama.cpp runs go without the repack and the row says so
  # (the subshell, not exec'd, takes the shell's own "Segmentation fault" line to /dev/null too)
  l_bench=(); l_batched=(); note=""
  ( "$BIN/llama-bench" -m "$gguf" -p 32 -n 0 -t "$THREADS" -r 1 -o json; exit $? ) >/dev/null 2>&1 && rc=0 || rc=$?
  if [ "$rc" -ge 128 ]; then
    "$BIN/llama-bench" -m "$gguf" -p 32 -n 0 -t "$THREADS" -r 1 --repack 0 -o json >/dev/null 2>&1 ||
      { echo "cpu-vs-llamacpp.sh: llama-bench on $gguf fails with and without --repack 0" >&2; exit 1; }
    l_bench=(--repack 0); l_batched=(--no-repack)
    note=" (llama.cpp --repack 0: its default died, signal $((rc - 128)))"
  fi
  fresh_cache "$set_dir"/*.pln "$gguf"
  : >"$DIR/p.txt"; : >"$DIR/l.txt"; pl_p=(); pl_l=()
  for ((r = 0, try = 0; r < REPS; try++)); do
    pb=$(placement)
    # shellcheck disable=SC2086
    "$POLLEN" bench "$set_dir" --prompt-len "$PROMPT_LEN" --batch 1,8,32 --context "$CONTEXT" --steps "$STEPS" \
      --kv-dtype f16 --threads "$THREADS" --mbu off $bopts --json 2>/dev/null >"$DIR/pollen.json"
    pre=$(num prefill_tokens_per_s <"$DIR/pollen.json")
    isa=$(grep -o '"cpu_isa":"[a-z0-9]*"' "$DIR/pollen.json" | cut -d'"' -f4)
    if [ "$AVX2" = 1 ] && [ "$isa" != avx2 ]; then
      echo "cpu-vs-llamacpp.sh: --avx2: pollen bench ran its ${isa:-unknown} kernels, not avx2" >&2; exit 1
    fi
    dec=$(grep -o '"batch":[0-9]*,[^}]*"tokens_per_s":[0-9.e+]*' "$DIR/pollen.json" | sed 's/"batch":\([0-9]*\),.*"tokens_per_s":/\1 /')
    p_row="$pre $(awk '$1 == 1 { print $2 }' <<<"$dec") $(awk '$1 == 8 { print $2 }' <<<"$dec") $(awk '$1 == 32 { print $2 }' <<<"$dec")"
    # the model's arithmetic per token (pollen bench's multiply-add counts, 2 ops each) in a
    # 512-token prefill and in a batch-32 step: both tools' rates in GOP/s for the last column
    if [ "$r" = 0 ]; then
      gpt_pre=$(awk -v g="$(num prefill_gops <"$DIR/pollen.json")" -v t="$pre" 'BEGIN { if (t > 0) print g / t }')
      gpt_b32=$(grep -o '"batch":32,[^}]*' "$DIR/pollen.json" | awk -F'"gops":' '{ split($2, a, /[,}]/); g = a[1] }
        END { print g }' | awk -v t="$(awk '$1 == 32 { print $2 }' <<<"$dec")" '{ if (t > 0 && $1 != "") print $1 / t }')
    fi
    pa=$(placement)   # after pollen's run, before llama.cpp's
    "$BIN/llama-bench" -m "$gguf" -p "$PROMPT_LEN" -n 0 -t "$THREADS" -r 1 "${l_bench[@]}" -o json 2>/dev/null >"$DIR/llama-bench.json"
    lpre=$(num avg_ts <"$DIR/llama-bench.json")
    "$BIN/llama-batched-bench" -m "$gguf" -c $(( 32 * (CONTEXT + STEPS) + 256 )) -npp "$CONTEXT" -ntg "$STEPS" \
      -npl 1,8,32 -t "$THREADS" "${l_batched[@]}" --output-format jsonl 2>&1 | grep '"speed_tg"' >"$DIR/llama-batched.jsonl" || true
    ldec() { grep "\"pl\": $1," "$DIR/llama-batched.jsonl" | num speed_tg; }
    la=$(placement)
    # --same-placement: a rep counts only if both tools began and ended in one placement, the
    # same for both; up to SAME_TRIES tries in all for the rep, after which the last try counts
    if [ "$SAME" = 1 ] && [ $(( try + 1 )) -lt "$SAME_TRIES" ] && [ "$pb $pa" != "$la $la" ]; then
      continue
    fi
    echo "$p_row" >>"$DIR/p.txt"
    echo "$lpre $(ldec 1) $(ldec 8) $(ldec 32)" >>"$DIR/l.txt"
    # where the first two CPUs sat before each tool's run, and after it where that differs
    pl_p+=("$pb$([ "$pa" = "$pb" ] || echo ">$pa")"); pl_l+=("$pa$([ "$la" = "$pa" ] || echo ">$la")")
    r=$(( r + 1 )); try=-1
  done
  P=(); L=()
  for c in 1 2 3 4; do
    P+=("$(awk -v c=$c '{ print $c }' "$DIR/p.txt" | best)")
    L+=("$(awk -v c=$c '{ print $c }' "$DIR/l.txt" | best)")
  done
  gops() { awk -v t="$1" -v f="$2" 'BEGIN { if (t == "" || f == "") print "?"; else printf "%.0f", t * f }'; }
  printf '| %s | %s | %s | %s | %s | %.0f / %.1f / %.1f / %.1f | %.0f / %.1f / %.1f / %.1f | %s / %s; %s / %s | %s; %s |\n' "$label$note" \
    "$(ratio "${P[0]}" "${L[0]}")" "$(ratio "${P[1]}" "${L[1]}")" "$(ratio "${P[2]}" "${L[2]}")" "$(ratio "${P[3]}" "${L[3]}")" \
    "${P[0]:-0}" "${P[1]:-0}" "${P[2]:-0}" "${P[3]:-0}" "${L[0]:-0}" "${L[1]:-0}" "${L[2]:-0}" "${L[3]:-0}" \
    "$(gops "${P[0]}" "$gpt_pre")" "$(gops "${P[3]}" "$gpt_b32")" "$(gops "${L[0]}" "$gpt_pre")" "$(gops "${L[3]}" "$gpt_b32")" \
    "$(IFS=,; echo "${pl_p[*]}")" "$(IFS=,; echo "${pl_l[*]}")"
done
echo
machine_load_after "$POLLEN"
