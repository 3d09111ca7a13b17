#!/usr/bin/env bash
# tools/bench/gpu.sh — the one GPU check of the CUDA backend (one call, under 8 minutes on one H200):
#   1. builds with nvcc there (or, where the machine lacks pollen's -dev packages, uses the
#      prebuilt bundle build/gpu-bundle/ made by tools/bench/gpu-bundle.sh and carried along);
#   2. runs what `make test-gpu` runs (tests/run-gpu.sh: every op against the CPU backend, the
#      engine end to end against the transformers fixtures);
#   3. tests/gpu/bench_decode: device copy GB/s and fp16 GEMM TFLOP/s ceilings, then one TP-8 rank
#      of BLOOM-176B with random weights made on the device (no files; all-reduces are no-ops on a
#      single rank): decode ms/token and MBU at batch 1, 8, 32, 128 for fp16 and int8, prefill
#      tokens/s for 512 tokens, per-op GB/s of the decode kernels against the copy ceiling;
#   4. loader GB/s on a synthesized bloom-7b1 shard on local disk (pollen synth + reshard), cold
#      (page cache dropped, where allowed) and warm, next to `cat FILE > /dev/null`;
#   5. prints one table last. Everything goes under $OUT (default ./gpu-results).
# Usage: tools/bench/gpu.sh        (from the repository root; OUT=dir to choose where results go)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
WORK=${PLN_BENCH_DIR:-/tmp/pln-gpu-bench}
BUDGET=${PLN_GPU_BUDGET_S:-450}          # stop starting optional stages after this many seconds
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
say() { echo "[$(elapsed)s] $*" | tee -a "$OUT/log.txt"; }
: > "$OUT/results.txt"
res() { echo "$1 $2 $3" >> "$OUT/results.txt"; }   # key value unit
tread() { local a b; a=$(date +%s.%N); cat "$1" > /dev/null; b=$(date +%s.%N); awk -v a="$a" -v b="$b" 'BEGIN{print b - a}'; }

say "== machine"
{ date -u; uname -a; nvidia-smi -L 2>&1; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1;
  command -v nvcc && nvcc --version | tail -2; nproc; free -g; df -h "$PWD" /tmp; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" | head -8

# ---- 1. build ----------------------------------------------------------------------------------
export PATH=$PATH:/usr/local/cuda/bin
JOBS=$(nproc)
BUILD=build
libpaths() {   # CUDA/NCCL libraries of the machine: the toolkit's, else the pip wheels next to PyTorch
  local d p=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && p="$p:$d"; done
  for d in $(python3 -c 'import nvidia, os; b = os.path.dirname(nvidia.__path__[0]) + "/nvidia"; print(" ".join(os.path.join(b, x, "lib") for x in os.listdir(b)))' 2>/dev/null); do
    [ -d "$d" ] && p="$p:$d"
  done
  echo "${p#:}"
}
export LD_LIBRARY_PATH="$(libpaths)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "== build (make -j$JOBS CUDA=1)"
GPU_BINS="$BUILD/tests-gpu/test_cuda_ops $BUILD/tests-gpu/test_cuda_e2e $BUILD/tests-gpu/test_cuda_nccl $BUILD/tests-gpu/bench_decode"
if make -j"$JOBS" CUDA=1 "$BUILD/pollen" $GPU_BINS > "$OUT/build.txt" 2>&1; then
  say "built here with $(command -v nvcc)"
elif [ -x build/gpu-bundle/pollen ] && [ -x build/gpu-bundle/tests-gpu/test_cuda_ops ]; then
  say "build here failed (see build.txt: $(grep -m1 -E 'error|No such file' "$OUT/build.txt"));" \
      "using the prebuilt bundle build/gpu-bundle/"
  BUILD=build/gpu-bundle
  export LD_LIBRARY_PATH="$PWD/build/gpu-bundle/lib:$LD_LIBRARY_PATH"
else
  say "BUILD FAILED and no prebuilt bundle (tools/bench/gpu-bundle.sh, carried as build/gpu-bundle/):"
  grep -m5 -E 'error' "$OUT/build.txt" | tee -a "$OUT/log.txt"
  exit 1
fi
res build_dir "$BUILD" -

# ---- 2. make test-gpu ----------------------------------------------------------------------------
say "== make test-gpu (tests/run-gpu.sh)"
BUILD=$BUILD CUDA=1 timeout 240 tests/run-gpu.sh > "$OUT/test-gpu.txt" 2>&1
echo "exit $?" >> "$OUT/test-gpu.txt"
grep -E 'NOT OK|^FAIL|^ok|^SKIP|passed, .* failed$' "$OUT/test-gpu.txt" | tail -n 25
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/test-gpu.txt" | tail -1)
if [ -n "$line" ]; then
  res test_gpu_passed "$(echo "$line" | awk '{print $1}')" tests
  res test_gpu_failed "$(echo "$line" | awk '{print $3}')" tests
fi
grep -q '^SKIP' "$OUT/test-gpu.txt" && res test_gpu_skip "$(grep -m1 '^SKIP' "$OUT/test-gpu.txt" | tr ' ' '_')" -

# ---- 3. decode / prefill / per-op ---------------------------------------------------------------
say "== bench_decode (one TP-8 rank of BLOOM-176B, random weights on the device)"
timeout 200 "$BUILD/tests-gpu/bench_decode" > "$OUT/bench.txt" 2>&1
echo "exit $?" >> "$OUT/bench.txt"
grep -v '^RESULT' "$OUT/bench.txt" | tail -n 60
grep '^RESULT' "$OUT/bench.txt" | sed 's/^RESULT //' >> "$OUT/results.txt"

# ---- 4. loader on a synthesized bloom-7b1 shard --------------------------------------------------
if [ "$(elapsed)" -lt "$BUDGET" ]; then
  say "== loader: pollen synth bloom-7b1 + reshard --tp 1 on local disk ($WORK)"
  rm -rf "$WORK"; mkdir -p "$WORK"
  if timeout 150 "$BUILD/pollen" synth --model bloom-7b1 -o "$WORK/src" --quiet > "$OUT/synth.txt" 2>&1 &&
     timeout 150 "$BUILD/pollen" reshard "$WORK/src" -o "$WORK/tp1" --tp 1 --dtype fp16 --quiet >> "$OUT/synth.txt" 2>&1; then
    rm -rf "$WORK/src"
    F="$WORK/tp1/rank-0-of-1.pln"
    sz=$(stat -c %s "$F")
    sync
    if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
      t=$(tread "$F"); res cat_cold_gbs "$(awk -v s="$sz" -v t="$t" 'BEGIN{printf "%.2f", s/t/1e9}')" GB/s
      echo 3 > /proc/sys/vm/drop_caches
      "$BUILD/tests-gpu/bench_decode" --load "$F" > "$OUT/load-cold.txt" 2>&1
      res load_cold_gbs "$(awk '/^RESULT load_gbs/{print $3}' "$OUT/load-cold.txt")" GB/s
    else
      say "cannot drop the page cache here: cold figures not measured"
    fi
    tread "$F" > /dev/null
    t=$(tread "$F"); res cat_warm_gbs "$(awk -v s="$sz" -v t="$t" 'BEGIN{printf "%.2f", s/t/1e9}')" GB/s
    "$BUILD/tests-gpu/bench_decode" --load "$F" > "$OUT/load-warm.txt" 2>&1
    res load_warm_gbs "$(awk '/^RESULT load_gbs/{print $3}' "$OUT/load-warm.txt")" GB/s
    res load_file_gb "$(awk -v s="$sz" 'BEGIN{printf "%.2f", s/1e9}')" GB
    cat "$OUT"/load-*.txt | grep -v RESULT
    rm -rf "$WORK"
  else
    say "synth/reshard failed or timed out:"; tail -3 "$OUT/synth.txt"
  fi
else
  say "loader stage skipped: $(elapsed)s used of the ${BUDGET}s budget"
fi

# ---- 5. the table ----------------------------------------------------------------------------------
v() { awk -v k="$1" '$1 == k {print $2; exit}' "$OUT/results.txt"; }
f() { local x; x=$(v "$1"); [ -n "$x" ] && printf "%.${2:-2}f" "$x" || printf -- "-"; }
{
  echo
  echo "pollen CUDA backend on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%Y-%m-%d)"
  echo "one TP-8 rank of BLOOM-176B, random weights, context 512; all-reduce is a no-op (single rank)"
  echo "ceilings: device copy $(f copy_gbs 0) GB/s, fp16 GEMM $(f gemm_tflops 0) TFLOP/s;" \
       "make test-gpu: $(f test_gpu_passed 0) passed, $(f test_gpu_failed 0) failed"
  printf "%-6s %6s %12s %12s %12s %8s\n" dtype batch "ms/step" "ms/token" "tokens/s" "MBU %"
  for dt in fp16 int8; do for b in 1 8 32 128; do
    printf "%-6s %6s %12s %12s %12s %8s\n" $dt $b "$(f decode_${dt}_b${b}_ms_step)" "$(f decode_${dt}_b${b}_ms_token 3)" \
      "$(f decode_${dt}_b${b}_tokens_s 0)" "$(f decode_${dt}_b${b}_mbu 0)"
  done; done
  echo "prefill 512 tokens: fp16 $(f prefill_fp16_512_tokens_s 0) tokens/s, int8 $(f prefill_int8_512_tokens_s 0) tokens/s;" \
       "with query-tiled attention: fp16 $(f prefill_fp16_512_tiled_tokens_s 0), int8 $(f prefill_int8_512_tiled_tokens_s 0)"
  a=$(v decode_fp16_b1_ms_step); b=$(v decode_int8_b1_ms_step); t1=$(v decode_fp16_b1_tokens_s); t128=$(v decode_fp16_b128_tokens_s)
  [ -n "$a" ] && [ -n "$b" ] && echo "int8/fp16 batch-1 time: $(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.2f", b/a}') (target <= 0.6)"
  [ -n "$t1" ] && [ -n "$t128" ] && echo "batch 128 / batch 1 tokens/s (fp16): $(awk -v a="$t1" -v b="$t128" 'BEGIN{printf "%.1f", b/a}') (target >= 60)"
  echo "decode kernels, batch 1 (GB/s; copy ceiling $(f copy_gbs 0)):"
  for op in query_key_value dense dense_h_to_4h+gelu dense_4h_to_h attention residual+layernorm logits; do
    printf "  %-20s fp16 %8s  int8 %8s\n" $op "$(f op_${op}_fp16_b1_gbs 0)" "$(f op_${op}_int8_b1_gbs 0)"
  done
  echo "loader ($(f load_file_gb 1) GB bloom-7b1 rank file): cold $(f load_cold_gbs) GB/s (cat $(f cat_cold_gbs) GB/s)," \
       "warm $(f load_warm_gbs) GB/s (cat $(f cat_warm_gbs) GB/s)"
  echo "elapsed $(elapsed) s; full results in $OUT"
} | tee "$OUT/table.txt"
