#!/usr/bin/env bash
# tools/bench/gpu.sh — the one GPU check of the CUDA backend (one call, under 8 minutes on one H200):
#   1. binaries: the prebuilt bundle build/gpu-bundle/ (tools/bench/gpu-bundle.sh, carried along)
#      when it was built from these very sources, else a build with nvcc there, else the bundle
#      anyway (marked stale); then a probe that stops everything at once, clearly, without a GPU;
#   2. runs what `make test-gpu` runs (tests/run-gpu.sh: every op against the CPU backend, the
#      engine end to end against the transformers fixtures);
#   3. tests/gpu/bench_decode: device copy GB/s and fp16 GEMM TFLOP/s ceilings, then one TP-8 rank
#      of BLOOM-176B with random weights made on the device (no files; all-reduces are no-ops on a
#      single rank): decode ms/token and MBU at batch 1, 8, 32, 128 for fp16 and int8, prefill
#      tokens/s for 512 tokens, per-op GB/s of the decode kernels against the copy ceiling; and the
#      int4 (groups of 128) linears at BLOOM-176B's full TP-1 width at T 1, 8, 16 and 512;
#   4. loader GB/s on a synthesized bloom-7b1 shard on local disk (pollen synth + reshard), cold
#      (page cache dropped, where allowed) and warm, next to `cat FILE > /dev/null`; then, with
#      what time is left, compute-sanitizer memcheck and racecheck on the op checks' small shapes;
#   5. prints one table last (also when a stage failed or the script stops early).
# Every stage runs under a timeout cut to what is left of PLN_GPU_LIMIT_S (default 450 s), so the
# whole script ends in time; optional stages start only before PLN_GPU_BUDGET_S (default 300 s).
# PLN_GPU_BUILD=0 never builds, =1 builds even when the bundle matches. Everything goes under
# $OUT (default ./gpu-results): table.txt, results.txt (key value unit), log.txt and one log per
# stage.
# Usage: tools/bench/gpu.sh        (from the repository root; OUT=dir to choose where results go)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
WORK=${PLN_BENCH_DIR:-/tmp/pln-gpu-bench}
LIMIT=${PLN_GPU_LIMIT_S:-450}
BUDGET=${PLN_GPU_BUDGET_S:-300}
MODE=${PLN_GPU_BUILD:-auto}
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
# cap N: a stage's timeout, N seconds or what is left before LIMIT (20 s kept for the table)
cap() { local c=$1 l=$(( LIMIT - $(elapsed) - 20 )); [ "$l" -lt "$c" ] && c=$l; [ "$c" -lt 1 ] && c=1; echo "$c"; }
left() { echo $(( LIMIT - $(elapsed) - 20 )); }
say() { echo "[$(elapsed)s] $*" | tee -a "$OUT/log.txt"; }
: > "$OUT/results.txt"
: > "$OUT/log.txt"
res() { echo "$1 $2 $3" >> "$OUT/results.txt"; }   # key value unit
tread() { local a b; a=$(date +%s.%N); timeout "$(cap 60)" cat "$1" > /dev/null || return 1; b=$(date +%s.%N); awk -v a="$a" -v b="$b" 'BEGIN{print b - a}'; }

# ---- 5. the table (written on every exit) ---------------------------------------------------------
v() { awk -v k="$1" '$1 == k {print $2; exit}' "$OUT/results.txt"; }
f() { local x; x=$(v "$1"); [ -n "$x" ] && printf "%.${2:-2}f" "$x" || printf -- "-"; }
table() {
  echo
  local gpu; gpu=$(timeout 10 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  echo "pollen CUDA backend on ${gpu:-no GPU (nvidia-smi found none)}, $(date -u +%Y-%m-%d)"
  echo "binaries: $(v binaries) ($(v build_dir)); gpu: $(v gpu)"
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
  local a b t1 t128
  a=$(v decode_fp16_b1_ms_step); b=$(v decode_int8_b1_ms_step); t1=$(v decode_fp16_b1_tokens_s); t128=$(v decode_fp16_b128_tokens_s)
  [ -n "$a" ] && [ -n "$b" ] && echo "int8/fp16 batch-1 time: $(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.2f", b/a}') (target <= 0.6)"
  [ -n "$t1" ] && [ -n "$t128" ] && echo "batch 128 / batch 1 tokens/s (fp16): $(awk -v a="$t1" -v b="$t128" 'BEGIN{printf "%.1f", b/a}') (target >= 60)"
  echo "decode kernels, batch 1 (GB/s; copy ceiling $(f copy_gbs 0)):"
  for op in query_key_value dense dense_h_to_4h+gelu dense_4h_to_h attention residual+layernorm logits; do
    printf "  %-20s fp16 %8s  int8 %8s\n" $op "$(f op_${op}_fp16_b1_gbs 0)" "$(f op_${op}_int8_b1_gbs 0)"
  done
  echo "int4 g128 at BLOOM-176B's full width (TP 1: the model on one GPU), GB/s of weights+scales (T 512: TFLOP/s follows in the log):"
  for op in query_key_value dense dense_h_to_4h dense_4h_to_h; do
    printf "  %-20s T1 %6s  T8 %6s  T16 %6s  T512 %6s us\n" $op "$(f op_int4_tp1_${op}_T1_gbs 0)" "$(f op_int4_tp1_${op}_T8_gbs 0)" \
      "$(f op_int4_tp1_${op}_T16_gbs 0)" "$(f op_int4_tp1_${op}_T512_us 0)"
  done
  echo "loader ($(f load_file_gb 1) GB $(v load_file) file): cold $(f load_cold_gbs) GB/s (cat $(f cat_cold_gbs) GB/s)," \
       "warm $(f load_warm_gbs) GB/s (cat $(f cat_warm_gbs) GB/s), warm with --verify checksums $(f load_verify_warm_gbs) GB/s"
  echo "compute-sanitizer on test_cuda_ops --quick: memcheck exit $(v sanitizer_memcheck_exit), $(v sanitizer_memcheck_reports) reports;" \
       "racecheck exit $(v sanitizer_racecheck_exit), $(v sanitizer_racecheck_reports) reports"
  echo "elapsed $(elapsed) s; full results in $OUT"
}
finish() { table | tee "$OUT/table.txt"; }
trap finish EXIT

say "== machine"
{ date -u; uname -a; timeout 20 nvidia-smi -L 2>&1;
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1;
  command -v nvcc && timeout 20 nvcc --version | tail -2; nproc; free -g; command -v mpirun && timeout 10 mpirun --version 2>&1 | head -1; ls /usr/include/jansson.h /usr/include/archive.h /usr/include/xxhash.h /usr/include/pcre2.h /usr/include/microhttpd.h 2>&1; df -h "$PWD" /tmp; } > "$OUT/machine.txt" 2>&1
head -8 "$OUT/machine.txt"

# ---- 1. binaries ---------------------------------------------------------------------------------
export PATH=$PATH:/usr/local/cuda/bin
JOBS=$(nproc)
BUNDLE=build/gpu-bundle
libpaths() {   # CUDA/NCCL libraries of the machine: the toolkit's, else the pip wheels next to PyTorch
  local d p=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && p="$p:$d"; done
  for d in $(timeout 30 python3 -c 'import nvidia, os; print(" ".join(os.path.join(b, x, "lib") for b in nvidia.__path__ for x in os.listdir(b)))' 2>/dev/null); do
    [ -d "$d" ] && p="$p:$d"
  done
  echo "${p#:}"
}
export LD_LIBRARY_PATH="$(libpaths)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SYS_LD_LIBRARY_PATH=$LD_LIBRARY_PATH
GPU_BINS="tests-gpu/test_cuda_ops tests-gpu/test_cuda_e2e tests-gpu/test_cuda_nccl tests-gpu/bench_decode"
HASH=$(bash tools/bench/gpu-bundle.sh --hash 2>/dev/null)
BHASH=$(cat "$BUNDLE/SOURCE" 2>/dev/null)
BUILD=""
# try_bundle: unpack (next to the bundle, not into it: build/gpu-bundle stays what is carried) and
# check that every library of its binaries resolves here
try_bundle() {
  local dir=build/gpu-bundle-run b miss=""
  if [ -f "$BUNDLE/bundle.tar.gz" ]; then
    rm -rf "$dir"; mkdir -p "$dir"
    tar -C "$dir" -xzf "$BUNDLE/bundle.tar.gz" || { say "cannot unpack $BUNDLE/bundle.tar.gz"; return 1; }
  elif [ -x "$BUNDLE/pollen" ]; then dir=$BUNDLE   # an unpacked bundle
  else say "no prebuilt bundle ($BUNDLE/bundle.tar.gz)"; return 1
  fi
  export LD_LIBRARY_PATH="$PWD/$dir/lib:$SYS_LD_LIBRARY_PATH"
  for b in pollen $GPU_BINS; do miss="$miss $(ldd "$dir/$b" 2>&1 | awk '/not found/ {print $1}')"; done
  miss=$(echo $miss | tr ' ' '\n' | sort -u | tr '\n' ' ')
  if [ -n "${miss// /}" ]; then
    say "the bundle's binaries cannot start here, libraries not found: $miss"
    export LD_LIBRARY_PATH=$SYS_LD_LIBRARY_PATH
    return 1
  fi
  BUILD=$dir
}
try_build() {
  local h miss=""
  for h in jansson.h archive.h xxhash.h pcre2.h microhttpd.h cublasLt.h nccl.h; do
    echo "#define PCRE2_CODE_UNIT_WIDTH 8
#include <$h>" | cc -E -I/usr/local/cuda/include -x c - > /dev/null 2>&1 || miss="$miss $h"
  done
  if [ -n "$miss" ]; then say "cannot build here: headers missing:$miss"; return 1; fi
  say "== build (make -j$JOBS CUDA=1, at most $(cap 300) s)"
  if timeout "$(cap 300)" make -j"$JOBS" CUDA=1 build/pollen build/tests/test_engine $(for b in $GPU_BINS; do echo build/$b; done) > "$OUT/build.txt" 2>&1; then
    say "built here with $(command -v nvcc)"; BUILD=build
  else
    say "build failed or timed out (see build.txt): $(grep -m1 -E 'error|No such file|Terminated' "$OUT/build.txt")"
    return 1
  fi
}
if [ "$MODE" != 1 ] && [ -n "$BHASH" ] && [ "$BHASH" = "$HASH" ] && try_bundle; then
  say "using the prebuilt bundle: it was built from these sources ($HASH)"; res binaries bundle -
elif [ "$MODE" != 0 ] && try_build; then
  res binaries built_here -
elif [ -z "$BUILD" ] && try_bundle; then
  if [ "$BHASH" = "$HASH" ]; then say "using the prebuilt bundle ($HASH)"; res binaries bundle -
  else
    say "WARNING: using the prebuilt bundle built from OTHER sources (${BHASH:-unknown}, tree $HASH): rerun tools/bench/gpu-bundle.sh"
    res binaries bundle_stale -
  fi
else
  say "NO BINARIES: no build here and no usable bundle (tools/bench/gpu-bundle.sh, carried as $BUNDLE/)"
  [ -f "$OUT/build.txt" ] && grep -m5 -E 'error' "$OUT/build.txt" | tee -a "$OUT/log.txt"
  res binaries none -
  exit 1
fi
res build_dir "$BUILD" -

# The GPU itself: without one there is nothing to measure, so stop here, saying why.
probe=$(timeout 60 "$BUILD/tests-gpu/test_cuda_ops" --probe 2>&1); rc=$?
if [ $rc -ne 0 ]; then
  say "NO USABLE GPU (probe exit $rc): $(echo "$probe" | grep -m1 -E 'SKIP|error' || echo "$probe" | tail -1)"
  res gpu none -
  exit 1
fi
res gpu ok -

# ---- 2. make test-gpu ----------------------------------------------------------------------------
say "== make test-gpu (tests/run-gpu.sh, at most $(cap 200) s)"
BUILD=$BUILD CUDA=1 PLN_TEST_GPU_TIMEOUT=150 timeout "$(cap 200)" bash tests/run-gpu.sh > "$OUT/test-gpu.txt" 2>&1
echo "exit $?" >> "$OUT/test-gpu.txt"
grep -E 'NOT OK|^FAIL|^ok|^skip|^SKIP|^TIMEOUT|passed, .* failed$' "$OUT/test-gpu.txt" | tail -n 25
line=$(grep -E '^(total: )?[0-9]+ passed, [0-9]+ failed' "$OUT/test-gpu.txt" | tail -1)
if [ -n "$line" ]; then
  res test_gpu_passed "$(echo "$line" | sed -E 's/^(total: )?([0-9]+) passed, ([0-9]+) failed.*/\2/')" tests
  res test_gpu_failed "$(echo "$line" | sed -E 's/^(total: )?([0-9]+) passed, ([0-9]+) failed.*/\3/')" tests
else
  say "test-gpu stopped before its summary (timeout?): see test-gpu.txt"
fi

# ---- 3. decode / prefill / per-op ---------------------------------------------------------------
if [ "$(left)" -ge 30 ]; then
  quick=""; [ "$(left)" -lt 150 ] && quick=--quick
  say "== bench_decode $quick (one TP-8 rank of BLOOM-176B, random weights on the device, at most $(cap 200) s)"
  timeout "$(cap 200)" "$BUILD/tests-gpu/bench_decode" $quick > "$OUT/bench.txt" 2>&1
  echo "exit $?" >> "$OUT/bench.txt"
  grep -v '^RESULT' "$OUT/bench.txt" | tail -n 60
  grep '^RESULT' "$OUT/bench.txt" | sed 's/^RESULT //' >> "$OUT/results.txt"
else
  say "bench_decode skipped: $(elapsed)s used of the ${LIMIT}s limit"
fi

# ---- 4. loader on a synthesized bloom-7b1 shard --------------------------------------------------
if [ "$(elapsed)" -lt "$BUDGET" ] && [ "$(left)" -ge 90 ]; then
  say "== loader: pollen synth bloom-7b1 + reshard --tp 1 on local disk ($WORK)"
  rm -rf "$WORK"; mkdir -p "$WORK"
  F=""
  if timeout "$(cap 150)" "$BUILD/pollen" synth --model bloom-7b1 -o "$WORK/src" --quiet > "$OUT/synth.txt" 2>&1; then
    if [ "$(left)" -ge 60 ] &&
       timeout "$(cap 150)" "$BUILD/pollen" reshard "$WORK/src" -o "$WORK/tp1" --tp 1 --dtype fp16 --quiet >> "$OUT/synth.txt" 2>&1; then
      rm -rf "$WORK/src"
      F="$WORK/tp1/rank-0-of-1.pln"; res load_file rank-0-of-1.pln -
    else   # the loader streams bytes: the biggest checkpoint file measures the same thing
      say "reshard failed or timed out: loading the largest synthesized checkpoint file instead"; tail -3 "$OUT/synth.txt"
      F=$(ls -S "$WORK"/src/*.safetensors 2>/dev/null | head -1); [ -n "$F" ] && res load_file "$(basename "$F")" -
      rm -rf "$WORK/tp1"
    fi
  else
    say "synth failed or timed out:"; tail -3 "$OUT/synth.txt"
  fi
  if [ -n "$F" ] && [ -f "$F" ]; then
    sz=$(stat -c %s "$F")
    res load_file_gb "$(awk -v s="$sz" 'BEGIN{printf "%.2f", s/1e9}')" GB
    timeout "$(cap 60)" sync
    if [ "$(left)" -ge 40 ] && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
      t=$(tread "$F") && res cat_cold_gbs "$(awk -v s="$sz" -v t="$t" 'BEGIN{printf "%.2f", s/t/1e9}')" GB/s
      echo 3 > /proc/sys/vm/drop_caches
      timeout "$(cap 60)" "$BUILD/tests-gpu/bench_decode" --load "$F" > "$OUT/load-cold.txt" 2>&1
      x=$(awk '/^RESULT load_gbs/{print $3}' "$OUT/load-cold.txt"); [ -n "$x" ] && res load_cold_gbs "$x" GB/s
    else
      say "cold figures not measured (cannot drop the page cache here, or no time left)"
    fi
    if [ "$(left)" -ge 30 ]; then
      tread "$F" > /dev/null
      t=$(tread "$F") && res cat_warm_gbs "$(awk -v s="$sz" -v t="$t" 'BEGIN{printf "%.2f", s/t/1e9}')" GB/s
      timeout "$(cap 60)" "$BUILD/tests-gpu/bench_decode" --load "$F" > "$OUT/load-warm.txt" 2>&1
      x=$(awk '/^RESULT load_gbs/{print $3}' "$OUT/load-warm.txt"); [ -n "$x" ] && res load_warm_gbs "$x" GB/s
      x=$(awk '/^RESULT load_verify_gbs/{print $3}' "$OUT/load-warm.txt"); [ -n "$x" ] && res load_verify_warm_gbs "$x" GB/s
    fi
    cat "$OUT"/load-*.txt 2>/dev/null | grep -v RESULT
  fi
  rm -rf "$WORK"
else
  say "loader stage skipped: $(elapsed)s used (budget ${BUDGET}s, limit ${LIMIT}s)"
fi

# ---- 4b. compute-sanitizer on the op checks, with what time is left -------------------------------
# memcheck finds out-of-bounds and misaligned accesses that happen not to change a result; racecheck
# finds shared-memory hazards. Both are slow: the small shapes only (--quick), each under a cap.
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "$SAN" ] && [ "$(left)" -ge 60 ]; then
  for tool in memcheck racecheck; do
    [ "$(left)" -ge 45 ] || { say "compute-sanitizer $tool skipped: no time left"; continue; }
    say "== compute-sanitizer --tool $tool test_cuda_ops --quick (at most $(cap 120) s)"
    timeout "$(cap 120)" "$SAN" --tool $tool --error-exitcode 99 "$BUILD/tests-gpu/test_cuda_ops" --quick \
      > "$OUT/sanitizer-$tool.txt" 2>&1
    rc=$?
    n=$(grep -cE '^========= (Invalid|Race|Error|Program hit)' "$OUT/sanitizer-$tool.txt" || true)
    summary=$(grep -E '^========= ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool.txt" | tail -1)
    say "compute-sanitizer $tool: exit $rc, $n reports; ${summary:-no summary (timeout?)}"
    res "sanitizer_${tool}_exit" "$rc" -
    res "sanitizer_${tool}_reports" "$n" -
  done
else
  say "compute-sanitizer skipped (${SAN:-not found}; $(left)s left)"
fi
