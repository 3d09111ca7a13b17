#!/usr/bin/env bash
# gemv-mca.sh — instructions, micro-ops and predicted cycles per byte of weights of each batch-1
# GEMV hot loop, pollen's beside llama.cpp's equivalent, from llvm-mca's Zen 4 and Zen 5 models.
#
# usage: tools/bench/gemv-mca.sh [LLAMA_CPP_SRC]
#   LLAMA_CPP_SRC: a llama.cpp source tree (its ggml/src); without one, pollen's rows only.
#   env MCA (default llvm-mca-19, else llvm-mca), MCA_CPUS (default "znver4 znver5"), BUILD (build).
#
# Static counts: they depend on the compiled code and the CPU model in llvm-mca, not on the machine
# the script runs on or its load. pollen's loops are cut from the objects the Makefile builds
# ($BUILD/kernels/cpu/simd_avx512.o, runtime-dispatched AVX-512 code, the same on every x86 CPU);
# llama.cpp's ggml_vec_dot_f16 (vec.cpp) and ggml_vec_dot_{q8_0_q8_0,q4_0_q8_0,q4_K_q8_K}
# (arch/x86/quants.c) are compiled here with the flags GCC 12's -march=native gives on Zen 4
# (znver3 plus Zen 4's AVX-512 set: GCC 12.2 knows no znver4), as llama.cpp's default native build
# would. Each loop is cut from the disassembly by tools/bench/gemv_mca_loop.py (one iteration of the
# smallest loop with the named instructions) and run through llvm-mca for 1000 iterations;
# "cycles" is llvm-mca's steady-state estimate with every load an L1 hit, i.e. the core's cost of
# the loop, not the memory's. Bytes per iteration are the weight bytes the iteration consumes
# (scales included, activations not), from the source of each loop.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
MCA=${MCA:-$(command -v llvm-mca-19 || command -v llvm-mca || true)}
MCA_CPUS=${MCA_CPUS:-znver4 znver5}
LLAMA=${1:-}
[ -n "$MCA" ] || { echo "gemv-mca.sh: no llvm-mca; install one (Debian: apt-get install llvm-19) or set MCA" >&2; exit 1; }
OBJ=$BUILD/kernels/cpu/simd_avx512.o
[ -f "$OBJ" ] || { echo "gemv-mca.sh: $OBJ missing; build first: make -j2 CUDA=0 build/pollen" >&2; exit 1; }
CUT=tools/bench/gemv_mca_loop.py
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# name | object | symbol | loop selector (gemv_mca_loop.py) | weight bytes per iteration | weights per iteration
rows=(
  "pollen fp16|$OBJ|gemv_f16_row|--need vfmadd:8 --need prefetch:4|256|128"
  "pollen int8 row|$OBJ|gemv_i8_row|--need vpmovsxbd:4 --need vfmadd:4 --not vmulps|64|64"
  "pollen int8 g32|$OBJ|gemv_i8_row|--need vpmovsxbd:4 --need to16:2 --need vcvtph2ps.*zmm:1 --inner 8|544|512"
  "pollen int4 g32|$OBJ|gemm_q8_vnni512|--need vpdpbusd:8 --need prefetch:5 --need vpermps:4|288|512"
  "pollen int4 g128|$OBJ|gemm_q8_vnni512|--need vpdpbusd:8 --need prefetch:5 --not vpermps|264|512"
)
if [ -n "$LLAMA" ]; then
  S=$LLAMA
  [ -d "$S/ggml/src" ] && S=$S/ggml/src
  [ -f "$S/ggml-cpu/arch/x86/quants.c" ] \
    || { echo "gemv-mca.sh: $LLAMA: no ggml-cpu/arch/x86/quants.c under it (give llama.cpp's source root or its ggml/src)" >&2; exit 1; }
  ZEN4="-march=znver3 -mavx512f -mavx512dq -mavx512bw -mavx512vl -mavx512vnni -mavx512bf16 -mavx512vbmi -mavx512ifma -mavx512cd -mavx512vbmi2 -mavx512bitalg -mavx512vpopcntdq -mgfni -mvpclmulqdq -mvaes"
  INC="-I$S/.. -I$S -I$S/ggml-cpu -I$S/../include -D_GNU_SOURCE -DNDEBUG -O3 -fopenmp $ZEN4"
  ${CC:-cc} $INC -std=gnu11 -c "$S/ggml-cpu/arch/x86/quants.c" -o "$TMP/quants.o"
  ${CXX:-c++} $INC -std=gnu++17 -c "$S/ggml-cpu/vec.cpp" -o "$TMP/vec.o"
  ${CXX:-c++} $INC -DGGML_USE_LLAMAFILE -std=gnu++17 -c "$S/ggml-cpu/llamafile/sgemm.cpp" -o "$TMP/sgemm.o"
  ${CXX:-c++} $INC -std=gnu++17 -c "$S/ggml-cpu/arch/x86/repack.cpp" -o "$TMP/repack.o"
  rows+=(
    "llama.cpp F16 (ggml_vec_dot_f16)|$TMP/vec.o|ggml_vec_dot_f16|--need vcvtph2ps:8 --need vfmadd:4|128|64"
    "llama.cpp Q8_0 (vec_dot_q8_0_q8_0)|$TMP/quants.o|ggml_vec_dot_q8_0_q8_0|--need vpdpbusd:1|34|32"
    "llama.cpp Q4_0 (vec_dot_q4_0_q8_0)|$TMP/quants.o|ggml_vec_dot_q4_0_q8_0|--need vpdpbusd:1|18|32"
    "llama.cpp Q4_K (vec_dot_q4_K_q8_K)|$TMP/quants.o|ggml_vec_dot_q4_K_q8_K|--need vpmaddubsw:8|144|256"
    "llama.cpp F16 decode (tinyBLAS 4x1)|$TMP/sgemm.o|tinyBLASILi16EDv16_fS1_ttfE4gemmILi4ELi1ELi1E|--need vcvtph2ps:5 --need vfmadd:4|128|64"
    "llama.cpp Q8_0 decode (tinyBLAS_Q0 4x1)|$TMP/sgemm.o|tinyBLAS_Q0_AVXI10block_q8_0S1_fE7gemm4xNILi1E|--need vpdpbusd:4|136|128"
    "llama.cpp Q4_0 decode (repack 8x8)|$TMP/repack.o|gemv_q4_b32_8x8_q8_0_lut_avx|--need vpdpbusd:8|144|256"
    "llama.cpp Q4_K decode (repack 8x8)|$TMP/repack.o|ggml_gemv_q4_K_8x8_q8_K|--need vpmaddubsw:16 --need vfmadd:2 --inner 4|1152|2048"
  )
fi

echo "# $("$MCA" --version | grep -m1 -i 'llvm version' | sed 's/^ *//'), $MCA -mcpu=CPU -iterations=1000"
echo "# per 64 bytes of weights: instructions, micro-ops, predicted cycles; B/cycle = weight bytes per core cycle"
printf '| %-40s | %4s | %6s |' "loop" "B/it" "w/it"
for cpu in $MCA_CPUS; do printf ' %s instr | uops | cycles | B/cycle |' "$cpu"; done
echo
printf '|%s|%s|%s|' "$(printf -- '-%.0s' {1..42})" "------" "--------"
for cpu in $MCA_CPUS; do printf -- '---|---|---|---|'; done
echo
for r in "${rows[@]}"; do
  IFS='|' read -r name obj sym sel bytes weights <<<"$r"
  # shellcheck disable=SC2086
  python3 "$CUT" "$obj" "$sym" $sel >"$TMP/loop.s"
  printf '| %-40s | %4s | %6s |' "$name" "$bytes" "$weights"
  for cpu in $MCA_CPUS; do
    "$MCA" -mcpu="$cpu" -iterations=1000 "$TMP/loop.s" >"$TMP/mca.txt" 2>"$TMP/mca.err" \
      || { echo; echo "gemv-mca.sh: $MCA failed on $name for $cpu:" >&2; cat "$TMP/mca.err" >&2; exit 1; }
    awk -v b="$bytes" '
      /^Instructions:/ { i = $2 } /^Total uOps:/ { u = $3 } /^Total Cycles:/ { c = $3 }
      END { n = 1000; printf " %.1f | %.1f | %.2f | %.1f |", i / n * 64 / b, u / n * 64 / b, c / n * 64 / b, b / (c / n) }' "$TMP/mca.txt"
  done
  echo
done
